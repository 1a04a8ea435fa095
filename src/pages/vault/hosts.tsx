import { EgressVia, HostAction } from "@benchwright/shared/contract/policy";
import { STARTER_PACK_HOSTS, STARTER_PACK_READ_ONLY } from "@benchwright/shared/policy/starter-pack";
import { Hono } from "hono";
import { addStarterPack, deleteHost, getHost, type HostEntry, putHost, updateHost } from "../../vault/hosts";
import { setDefault } from "../../vault/settings";
import type { PageEnv } from "../context";
import { PostForm } from "../layout";
import { act, answer, back, type Ctx, form, listField, listText, PAGE, refused, text, who } from "./forms";
import { ButtonForm, CodeCell, DeleteCell, Pager, pageOf, plural, Section, Table } from "./section";

// The vault page's host policy: the default for hosts no entry names (a vault setting,
// src/vault/settings.ts), the starter pack, and the host entries with their routes and method
// and path limits (src/vault/hosts.ts).

export function HostsSection(props: { c: Ctx; csrf: string; hosts: HostEntry[]; defaultAction: HostAction }) {
  const { c, csrf } = props;
  const page = pageOf(c, props.hosts, "hostsFrom");
  const other = (a: HostAction): HostAction => (a === "allow" ? "block" : "allow");
  return (
    <Section id="hosts" title="Host policy">
      <PostForm action={`${PAGE}/default`} csrf={csrf} class="fields">
        <label>
          Hosts no entry names are{" "}
          <select name="default">
            {(["allow", "block"] as const).map((a) => (
              <option value={a} selected={a === props.defaultAction}>
                {a === "allow" ? "allowed" : "blocked"}
              </option>
            ))}
          </select>
        </label>{" "}
        <button type="submit">Save default</button>
      </PostForm>
      <div class="fields">
        <ButtonForm action={`${PAGE}/starter-pack`} csrf={csrf} label="Add the starter pack" inline />{" "}
        <span class="muted">
          allows {STARTER_PACK_HOSTS.length} package and source hosts (npm, PyPI, GitHub, Debian, Ubuntu,
          crates, Go, Maven, ...), the {STARTER_PACK_READ_ONLY.size} source hosts (GitHub's, PyPI, npm)
          read-only (GET, HEAD); entries you have are left as they are.
        </span>
      </div>
      <Table
        rows={page.rows}
        empty="No host entries: every host gets the default."
        head={["Pattern", "Action", "Route", "Limits", "Change", "Delete"]}
        widths={["", "c-name", "c-name", "", "c-btn", "c-btn"]}
        row={(h) => (
          <tr>
            <CodeCell text={h.pattern} />
            <td>
              {h.action}
              {h.implicit ? <span class="muted"> (for a rule)</span> : null}
            </td>
            <td>
              {h.action === "block" ? (
                <span class="muted">—</span>
              ) : (
                <PostForm action={`${PAGE}/hosts/${h.id}`} csrf={csrf}>
                  <ViaSelect selected={h.via} label={`Route of ${h.pattern}`} />{" "}
                  <button type="submit">Set</button>
                </PostForm>
              )}
            </td>
            <td>
              {h.action === "block" ? (
                <span class="muted">—</span>
              ) : (
                <PostForm action={`${PAGE}/hosts/${h.id}/limits`} csrf={csrf}>
                  <input
                    name="methods"
                    maxlength={300}
                    placeholder="any method"
                    aria-label={`Methods of ${h.pattern}`}
                    value={listText(h.methods)}
                  />{" "}
                  <input
                    name="paths"
                    maxlength={4096}
                    placeholder="any path"
                    aria-label={`Paths of ${h.pattern}`}
                    value={listText(h.paths)}
                  />{" "}
                  <button type="submit">Set</button>
                </PostForm>
              )}
            </td>
            <td>
              <ButtonForm
                action={`${PAGE}/hosts/${h.id}`}
                csrf={csrf}
                label={other(h.action) === "allow" ? "Allow" : "Block"}
                hidden={{ action: other(h.action) }}
              />
            </td>
            <DeleteCell action={`${PAGE}/hosts/${h.id}/delete`} csrf={csrf} />
          </tr>
        )}
      />
      <Pager {...page} anchor="hosts" />
      <h3>Allow or block a host</h3>
      <PostForm action={`${PAGE}/hosts`} csrf={csrf} class="fields">
        <label>
          Host or <code>*.domain</code>{" "}
          <input
            name="pattern"
            required
            maxlength={300}
            placeholder="*.evil.example"
            value={c.req.query("hostPattern") ?? ""}
          />
        </label>{" "}
        <select name="action" aria-label="Action">
          {(["block", "allow"] as const).map((a) => (
            <option value={a} selected={a === (c.req.query("hostAction") ?? "block")}>
              {a}
            </option>
          ))}
        </select>{" "}
        <ViaSelect selected={hostVia(c.req.query("hostVia")) ?? null} label="Route (allowed hosts only)" />{" "}
        <label>
          Methods{" "}
          <input
            name="methods"
            maxlength={300}
            placeholder="any (e.g. GET, HEAD)"
            value={c.req.query("hostMethods") ?? ""}
          />
        </label>{" "}
        <label>
          Paths{" "}
          <input
            name="paths"
            maxlength={4096}
            placeholder="any (e.g. /repos/acme/, /orgs/)"
            value={c.req.query("hostPaths") ?? ""}
          />
        </label>{" "}
        <button type="submit">Save entry</button>
      </PostForm>
      <p class="muted">
        An allowed host's route: <strong>tunnel</strong> sends its traffic through your own machine (the
        egress agent), which makes runs use catch-all routing; <strong>direct</strong> sends it straight out;
        unset, the run decides (a run launched with egress "local" sends everything through your machine). A
        blocked host has no route.
      </p>
      <p class="muted">
        An allowed host's limits: the methods (comma-separated, e.g. <code>GET, HEAD</code>) and paths
        (comma-separated prefixes such as <code>/repos/acme/</code>, or globs with <code>*</code> and{" "}
        <code>**</code>) its requests may use; the proxy answers anything else with 403. Blank is no limit. A
        limited host always goes through the proxy. A blocked host has no limits.
      </p>
    </Section>
  );
}

/** The route choice of an allowed host; "" is unset (the run's egress decides). */
function ViaSelect(props: { selected: EgressVia | null; label: string }) {
  const options: [string, string][] = [
    ["", "as the run's egress"],
    ["tunnel", "tunnel (your machine)"],
    ["direct", "direct"],
  ];
  return (
    <select name="via" aria-label={props.label}>
      {options.map(([value, label]) => (
        <option value={value} selected={value === (props.selected ?? "")}>
          {label}
        </option>
      ))}
    </select>
  );
}

/** An entry's limits for a flash: " (GET, HEAD; paths /a, /b)", or "" for none. */
function limitsNote(h: HostEntry): string {
  const parts = [h.methods?.join(", "), h.paths ? `paths ${h.paths.join(", ")}` : undefined].filter(Boolean);
  return parts.length > 0 ? ` (${parts.join("; ")})` : "";
}

export function hostAction(v: string | undefined): HostAction | null {
  const parsed = HostAction.safeParse(v);
  return parsed.success ? parsed.data : null;
}

/** A form's route: "" or absent → null (unset); anything else must be tunnel or direct. */
function hostVia(v: string | undefined): EgressVia | null | undefined {
  if (v === undefined || v === "") return null;
  const parsed = EgressVia.safeParse(v);
  return parsed.success ? parsed.data : undefined;
}

export const hostsRoutes = new Hono<PageEnv>()
  .post(`${PAGE}/hosts`, (c) =>
    act(c, "hosts", async () => {
      const f = await form(c);
      const pattern = text(f, "pattern");
      const action = hostAction(f.action);
      const via = hostVia(f.via);
      const keep = {
        hostPattern: pattern,
        hostAction: f.action,
        hostVia: f.via,
        hostMethods: f.methods,
        hostPaths: f.paths,
      };
      if (!pattern) return back(c, { error: "Give a host or *.domain." }, "hosts", keep);
      if (pattern.length > 300)
        return back(c, { error: "A host pattern is at most 300 characters." }, "hosts");
      if (!action) return back(c, { error: "Pick allow or block." }, "hosts", keep);
      if (via === undefined) return back(c, { error: "Pick tunnel, direct or no route." }, "hosts", keep);
      const limits = { methods: listField(f, "methods"), paths: listField(f, "paths") };
      const done = await putHost(c.var.db, who(c), { pattern, action, via, ...limits });
      return answer(
        c,
        done,
        (h) =>
          `${h.action === "allow" ? "Allowed" : "Blocked"} ${h.pattern}${h.via ? ` (route: ${h.via})` : ""}${limitsNote(h)}.`,
        "hosts",
        keep,
      );
    }),
  )
  .post(`${PAGE}/hosts/:id`, (c) =>
    act(c, "hosts", async () => {
      const f = await form(c);
      // The row's Allow/Block button sends action; its route form sends via ("" clears it).
      if (f.via !== undefined) {
        const via = hostVia(f.via);
        if (via === undefined) return back(c, { error: "Pick tunnel, direct or no route." }, "hosts");
        const done = await updateHost(c.var.db, who(c), c.req.param("id"), { via });
        return answer(
          c,
          done,
          (h) =>
            h.via
              ? `${h.pattern} now goes ${h.via === "tunnel" ? "through your machine (tunnel)" : "direct"}.`
              : `${h.pattern} now goes as the run's egress says.`,
          "hosts",
        );
      }
      const action = hostAction(f.action);
      if (!action) return back(c, { error: "Pick allow or block." }, "hosts");
      const done = await updateHost(c.var.db, who(c), c.req.param("id"), { action });
      return answer(c, done, (h) => `${h.action === "allow" ? "Allowed" : "Blocked"} ${h.pattern}.`, "hosts");
    }),
  )
  .post(`${PAGE}/hosts/:id/limits`, (c) =>
    act(c, "hosts", async () => {
      const f = await form(c);
      const limits = { methods: listField(f, "methods"), paths: listField(f, "paths") };
      const done = await updateHost(c.var.db, who(c), c.req.param("id"), limits);
      return answer(
        c,
        done,
        (h) => (limitsNote(h) ? `${h.pattern}${limitsNote(h)}.` : `${h.pattern} has no limits now.`),
        "hosts",
      );
    }),
  )
  .post(`${PAGE}/hosts/:id/delete`, (c) =>
    act(c, "hosts", async () => {
      const id = c.req.param("id");
      const entry = await getHost(c.var.db, who(c), id);
      if (!entry.ok) return refused(c, entry.error, "hosts");
      const done = await deleteHost(c.var.db, who(c), id);
      return answer(c, done, () => `Deleted the entry for ${entry.value.pattern}.`, "hosts");
    }),
  )
  .post(`${PAGE}/default`, (c) =>
    act(c, "hosts", async () => {
      const action = hostAction((await form(c)).default);
      if (!action) return back(c, { error: "Pick allow or block as the default." }, "hosts");
      const done = await setDefault(c.var.db, who(c), action);
      return answer(
        c,
        done,
        (s) =>
          s.default === "allow"
            ? "Hosts no entry names are now allowed."
            : "Hosts no entry names are now blocked.",
        "routing",
      );
    }),
  )
  .post(`${PAGE}/starter-pack`, (c) =>
    act(c, "hosts", async () => {
      const done = await addStarterPack(c.var.db, who(c));
      return answer(
        c,
        done,
        ({ added, kept }) =>
          `Starter pack: allowed ${plural(added.length, "host")}` +
          (kept.length > 0
            ? `; left ${plural(kept.length, "host")} you already had an entry for as they were.`
            : "."),
        "hosts",
      );
    }),
  );
