import { describe, expect, it } from "vitest";
import { loggedIn } from "./browser";
import { newTenant } from "./harness";
import { findNeedles, leakNeedles, newCanary } from "./leaks";
import { apiOf, recording, routing, VAULT } from "./pages-fixtures";
import { runWithAudit } from "./run-fixtures";

// The vault page's dry run (src/pages/vault/dry-run.tsx): a change tried against the hosts a run
// recorded, its routing consequence, saving it, its refusals, and another tenant's run out of
// reach. Apart because it reads runs' audit rows, which the other vault sections do not.

describe("vault page: dry run", { timeout: 60_000 }, () => {
  it("shows the run's hosts decided under the change and now, the routing it forces, and saves it", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    expect((await b.get(VAULT)).html).toContain("No runs yet: a dry run replays the hosts a run recorded.");
    const canary = newCanary("dryrun");
    await b.submit(`${VAULT}/secrets`, { name: "API_KEY", value: canary });
    await b.submit(`${VAULT}/rules`, { host: "api.dry.example", secret: "API_KEY", scheme: "bearer" });
    const run = await runWithAudit(t, ["api.dry.example", "pkg.dry.example", "zzz.dry.example"]);
    const page = await b.get(VAULT);
    expect(page.html).toContain(`<option value="${run.id}">`);

    // The default becomes block: pkg and zzz would be refused, api keeps its rule; catch-all.
    const q = new URLSearchParams({ runId: run.id, pattern: "", action: "block", default: "block" });
    const dry = await b.get(`${VAULT}/dry-run?${q}`);
    expect(dry.status).toBe(200);
    const rows = [
      ...dry.html.matchAll(
        /<tr><td><code>([^<]+)<\/code><\/td><td>(.*?)<\/td><td>(.*?)<\/td><td>(.*?)<\/td><\/tr>/g,
      ),
    ].map((m) => [m[1], ...[m[2], m[3], m[4]].map((x) => (x ?? "").replace(/<[^>]+>/g, ""))]);
    expect(rows).toEqual([
      ["pkg.dry.example", "allow, direct", "block", "changed"],
      ["zzz.dry.example", "allow, direct", "block", "changed"],
      [
        "api.dry.example",
        "allow, inject rule #1 (API_KEY), direct",
        "allow, inject rule #1 (API_KEY), direct",
        "—",
      ],
    ]);
    expect(dry.html).toContain("3 hosts recorded, 2 decided differently.");
    const routingText = dry.html.replace(/<[^>]+>/g, "");
    expect(routingText).toContain("Now: default");
    expect(routingText).toContain("With the change: catch-all (The default is block)");
    expect(routingText).toContain("This change switches runs to catch-all routing, which costs:");
    expect(routingText).toContain("must be allowed, or installs fail");
    expect(routingText).toContain("A run already running keeps the routing it started with");
    expect(await apiOf(t).settings()).toMatchObject({ default: "allow" }); // nothing saved yet

    // A host entry alone: only that host changes, routing stays.
    const one = await b.get(
      `${VAULT}/dry-run?${new URLSearchParams({ runId: run.id, pattern: "pkg.dry.example", action: "block", default: "" })}`,
    );
    expect(one.html).toContain("3 hosts recorded, 1 decided differently.");
    expect(one.html).not.toContain("switches runs to catch-all");
    expect(one.html).toContain('<input type="hidden" name="pattern" value="pkg.dry.example"/>');

    // Save this change (from the first dry run): the default is saved through the service.
    const saved = await b.submit(`${VAULT}/dry-run/save`, { default: "block" });
    expect(saved.ok).toBe("Saved: hosts no entry names blocked.");
    expect((await apiOf(t).settings()).default).toBe("block");
    expect(routing(saved.page.html)).toContain("gets catch-all routing");
    const both = await b.submit(`${VAULT}/dry-run/save`, {
      pattern: "pkg.dry.example",
      action: "allow",
      default: "block",
    });
    expect(both.ok).toBe("Saved: allowed pkg.dry.example; hosts no entry names blocked.");
    // Now the same dry run shows pkg allowed under both.
    const after = await b.get(`${VAULT}/dry-run?${q}`);
    expect(after.html).toContain("3 hosts recorded, 0 decided differently.");

    // Refusals come back to the vault page's form, with what was typed.
    const cases: [Record<string, string>, string][] = [
      [{ runId: "", default: "block" }, "Pick a run: the dry run replays the hosts it recorded."],
      [{ runId: run.id, pattern: "", default: "" }, "Nothing to try: give a host entry or a new default."],
      [{ runId: "run_nope", default: "block" }, "No run run_nope."],
      [{ runId: run.id, pattern: "*.com", action: "block" }, '"*.com"'],
      [{ runId: run.id, pattern: "api.dry.example", action: "block" }, "injects a credential"],
    ];
    for (const [fields, error] of cases) {
      const res = await b.get(`${VAULT}/dry-run?${new URLSearchParams(fields)}`);
      expect(res.status, JSON.stringify(fields)).toBe(303);
      const url = new URL(res.location ?? "", "http://x");
      expect(url.pathname).toBe(VAULT);
      expect(url.searchParams.get("error") ?? "").toContain(error);
      const back = await b.get(`${url.pathname}${url.search}`);
      if (fields.runId) expect(back.html).toContain(`value="${fields.runId}"`);
    }
    const refusedSave = await b.submit(`${VAULT}/dry-run/save`, {
      pattern: "api.dry.example",
      action: "block",
    });
    expect(refusedSave.error).toContain("injects a credential for this host");

    // Another tenant cannot dry-run this run: the same answer as no run at all.
    const other = recording(await loggedIn(await newTenant()));
    const foreign = await other.get(
      `${VAULT}/dry-run?${new URLSearchParams({ runId: run.id, default: "block" })}`,
    );
    expect(foreign.status).toBe(303);
    expect(new URL(foreign.location ?? "", "http://x").searchParams.get("error")).toBe(`No run ${run.id}.`);

    const needles = await leakNeedles(canary);
    expect(b.log.flatMap((text, i) => findNeedles(`response ${i}`, text, needles))).toEqual([]);
  });
});
