import { describe, expect, it } from "vitest";
import { loggedIn } from "./browser";
import { newTenant } from "./harness";
import { findNeedles, leakNeedles, newCanary } from "./leaks";
import { actionIds, api, recording, VAULT } from "./pages-fixtures";

// The vault page's secrets section (/manage/vault, src/pages/vault/secrets.tsx) through the real
// Worker and Postgres: add, replace and delete, each form's flash, and case B5 (a secret's value
// never appears in any page, redirect or flash).

describe("vault page: secrets", { timeout: 60_000 }, () => {
  it("an added secret shows its name and fingerprint; its value appears in no page, redirect or flash", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    const canary = newCanary("page");
    const empty = await b.get(VAULT);
    expect(empty.html).toContain("No secrets yet");

    const added = await b.submit(`${VAULT}/secrets`, { name: "CANARY_KEY", value: canary });
    expect(added.error).toBeNull();
    const [secret] = await api.secrets(t);
    expect(secret?.name).toBe("CANARY_KEY");
    expect(added.ok).toContain("Added CANARY_KEY");
    expect(added.page.html).toContain("CANARY_KEY");
    expect(added.page.html).toContain(secret?.fingerprint);
    expect(added.page.html).toContain('<p class="ok">');

    // Failing adds: the same name again (secret_exists), a value with a line break, a bad name,
    // no name, no value. Each says why; none sends the value back, not even into the form.
    const again = await b.submit(`${VAULT}/secrets`, { name: "CANARY_KEY", value: `${canary}2` });
    expect(again.error).toContain("A secret named CANARY_KEY exists");
    expect(again.page.html).toContain('value="CANARY_KEY"'); // the name is kept for retyping
    const crlf = await b.submit(`${VAULT}/secrets`, { name: "OTHER", value: `${canary}\r\nx: y` });
    expect(crlf.error).toContain("printable ASCII");
    const badName = await b.submit(`${VAULT}/secrets`, { name: "1 bad name", value: canary });
    expect(badName.error).toContain("That is not a secret name");
    const noName = await b.submit(`${VAULT}/secrets`, { name: " ", value: canary });
    expect(noName.error).toBe("Give the secret a name.");
    const noValue = await b.submit(`${VAULT}/secrets`, { name: "NO_VALUE", value: "" });
    expect(noValue.error).toBe("Enter the secret's value.");
    const tooLong = await b.submit(`${VAULT}/secrets`, { name: "LONG", value: canary.repeat(600) });
    expect(tooLong.error).toBe("A secret value is at most 16 KiB.");
    expect((await api.secrets(t)).map((s) => s.name)).toEqual(["CANARY_KEY"]);

    // Replacing the value: a new fingerprint, the old and new values nowhere.
    const second = newCanary("second");
    const id = secret?.id ?? "";
    const replaced = await b.submit(`${VAULT}/secrets/${id}/replace`, { value: second });
    const [after] = await api.secrets(t);
    expect(after?.fingerprint).not.toBe(secret?.fingerprint);
    expect(replaced.ok).toContain(after?.fingerprint);
    expect(replaced.page.html).toContain(after?.fingerprint);
    const badReplace = await b.submit(`${VAULT}/secrets/${id}/replace`, { value: `${second}\n` });
    expect(badReplace.error).toContain("printable ASCII");
    expect((await api.secrets(t))[0]?.fingerprint).toBe(after?.fingerprint);

    const needles = [...(await leakNeedles(canary)), ...(await leakNeedles(second))];
    expect(b.log.length).toBeGreaterThan(10);
    expect(b.log.flatMap((text, i) => findNeedles(`response ${i}`, text, needles))).toEqual([]);
    // Value fields are password fields with nothing filled in.
    expect(replaced.page.html).not.toMatch(/type="password"[^>]*value=/);
  });

  it("delete: a secret no rule uses goes; one a rule uses is refused with the reason", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    await b.submit(`${VAULT}/secrets`, { name: "SPARE", value: "spare-value-1" });
    await b.submit(`${VAULT}/secrets`, { name: "USED", value: "used-value-1" });
    const rule = await t.api("POST", "/v1/vault/rules", {
      host: "api.used.example",
      secret: "USED",
      inject: { scheme: "bearer" },
    });
    expect(rule.status).toBe(201);
    const byName = new Map((await api.secrets(t)).map((s) => [s.name, s.id]));
    const page = await b.get(VAULT);
    expect(page.html).toContain("used by rule #1");
    expect(actionIds(page.html, "secrets")).toContain(byName.get("USED"));

    const refused = await b.submit(`${VAULT}/secrets/${byName.get("USED")}/delete`, {});
    expect(refused.error).toContain(`Rules ${rule.json.id} use this secret`);
    expect(refused.page.html).toContain(`Rules ${rule.json.id} use this secret`);
    const gone = await b.submit(`${VAULT}/secrets/${byName.get("SPARE")}/delete`, {});
    expect(gone.ok).toBe("Deleted SPARE.");
    expect((await api.secrets(t)).map((s) => s.name)).toEqual(["USED"]);
  });
});
