import { SecretName } from "@benchwright/shared/contract/proxy-wire";
import { Hono } from "hono";
import { createSecret, deleteSecret, getSecret, replaceSecret, type SecretInfo } from "../../vault/secrets";
import type { PageEnv } from "../context";
import { PostForm } from "../layout";
import { act, answer, back, type Ctx, form, PAGE, refused, text, who } from "./forms";
import { CodeCell, DeleteCell, Pager, pageOf, Section, Table, when } from "./section";

// The vault page's secrets: names and fingerprints, never a value. A value is only ever read
// from a password field and handed to the service (src/vault/secrets.ts): it is never put in a
// page, a redirect or a flash, not even after an error.

const MAX_SECRET_VALUE = 16_384;
const SECRET_NAME_RULE = "letters, digits, _ . - (at most 64), starting with a letter or _";

export function SecretsSection(props: {
  c: Ctx;
  csrf: string;
  secrets: SecretInfo[];
  usedBy: Map<string, number[]>;
}) {
  const { c, csrf } = props;
  const page = pageOf(c, props.secrets, "secretsFrom");
  return (
    <Section id="secrets" title="Secrets">
      <p class="muted">
        Values are write-only: they are encrypted in the vault and reach only a run's proxy. This page shows
        each secret's name and fingerprint, never its value.
      </p>
      <Table
        rows={page.rows}
        empty="No secrets yet. Add one below, then a rule that injects it."
        head={["Name", "Fingerprint", "Updated", "Replace value", "Delete"]}
        widths={["c-name", "", "c-date", "c-form", "c-btn"]}
        row={(s) => {
          const used = props.usedBy.get(s.name) ?? [];
          return (
            <tr>
              <td>
                <code>{s.name}</code>
                {used.length > 0 ? (
                  <div class="muted">{`used by rule ${used.map((n) => `#${n}`).join(", ")}`}</div>
                ) : null}
              </td>
              <CodeCell text={s.fingerprint} />
              <td>{when(s.updatedAt)}</td>
              <td>
                <PostForm action={`${PAGE}/secrets/${s.id}/replace`} csrf={csrf}>
                  <input
                    type="password"
                    name="value"
                    autocomplete="new-password"
                    required
                    aria-label={`New value for ${s.name}`}
                    size={16}
                  />{" "}
                  <button type="submit">Replace</button>
                </PostForm>
              </td>
              <DeleteCell action={`${PAGE}/secrets/${s.id}/delete`} csrf={csrf} />
            </tr>
          );
        }}
      />
      <Pager {...page} anchor="secrets" />
      <h3>Add a secret</h3>
      <PostForm action={`${PAGE}/secrets`} csrf={csrf} class="fields">
        <label>
          Name{" "}
          <input
            name="name"
            required
            maxlength={64}
            pattern="[A-Za-z_][A-Za-z0-9_.\-]{0,63}"
            placeholder="OPENROUTER_API_KEY"
            value={c.req.query("secretName") ?? ""}
          />
        </label>{" "}
        <label>
          Value <input type="password" name="value" autocomplete="new-password" required maxlength={16384} />
        </label>{" "}
        <button type="submit">Add secret</button>
      </PostForm>
    </Section>
  );
}

/** The API's own bounds on a value (the service checks its characters); never quotes it. */
function valueProblem(value: string): string | null {
  if (value === "") return "Enter the secret's value.";
  if (value.length > MAX_SECRET_VALUE) return "A secret value is at most 16 KiB.";
  return null;
}

export const secretsRoutes = new Hono<PageEnv>()
  .post(`${PAGE}/secrets`, (c) =>
    act(c, "secrets", async () => {
      const f = await form(c);
      const name = text(f, "name");
      // The value is taken as typed (no trim: spaces may be part of it) and never sent back.
      const value = f.value ?? "";
      if (!name) return back(c, { error: "Give the secret a name." }, "secrets");
      if (!SecretName.safeParse(name).success) {
        // Not quoted back: a value pasted into the wrong field must not come back in a URL.
        const error = `That is not a secret name: ${SECRET_NAME_RULE}.`;
        return back(c, { error }, "secrets");
      }
      const bad = valueProblem(value);
      if (bad) return back(c, { error: bad }, "secrets", { secretName: name });
      const made = await createSecret(c.var.db, c.var.config.keyRing, who(c), { name, value });
      return answer(c, made, (s) => `Added ${s.name} (${s.fingerprint}).`, "secrets", { secretName: name });
    }),
  )
  .post(`${PAGE}/secrets/:id/replace`, (c) =>
    act(c, "secrets", async () => {
      const value = (await form(c)).value ?? "";
      const bad = valueProblem(value);
      if (bad) return back(c, { error: bad }, "secrets");
      const done = await replaceSecret(c.var.db, c.var.config.keyRing, who(c), c.req.param("id"), {
        value,
      });
      return answer(c, done, (s) => `Replaced the value of ${s.name} (now ${s.fingerprint}).`, "secrets");
    }),
  )
  .post(`${PAGE}/secrets/:id/delete`, (c) =>
    act(c, "secrets", async () => {
      const id = c.req.param("id");
      const secret = await getSecret(c.var.db, who(c), id);
      if (!secret.ok) return refused(c, secret.error, "secrets");
      const done = await deleteSecret(c.var.db, who(c), id);
      return answer(c, done, () => `Deleted ${secret.value.name}.`, "secrets");
    }),
  );
