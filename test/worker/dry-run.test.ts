import { describe, expect, it } from "vitest";
import { type ApiResponse, expectProblem, newTenant, type Tenant } from "./harness";
import { findNeedles, leakNeedles, newCanary, responseText } from "./leaks";
import { auditBatch, newRun, postBatch, type TestRun } from "./run-fixtures";

// POST /v1/vault/dry-run (src/vault/dry-run.ts): a run's recorded hosts replayed against a draft
// vault and the vault as it is, with the proxy's own compile and decisions. The runs' hosts are
// stored the honest way: a signed audit batch through the internal API with the run's proxy token.

const at = (second: number) => new Date(Date.UTC(2026, 2, 1, 9, 0, second)).toISOString();

interface Fixture {
  t: Tenant;
  tag: string;
  run: TestRun;
  canary: string;
  /** Every response, for the leak scan. */
  responses: [string, ApiResponse][];
  dry: (body: unknown) => Promise<ApiResponse>;
  h: (name: string) => string;
}

/**
 * A vault: API_KEY (a canary value) injected for api.<tag>.example (rule 0, so an implicit allow
 * entry), evil.<tag>.example blocked, default allow. A run that reached api, pypi and
 * other.<tag>.example directly and was refused evil.<tag>.example.
 */
async function fixture(spec?: Record<string, unknown>): Promise<Fixture> {
  const t = await newTenant();
  const tag = crypto.randomUUID().slice(0, 8);
  const h = (name: string) => `${name}.${tag}.example`;
  const canary = newCanary("dryrun");
  expect((await t.api("POST", "/v1/vault/secrets", { name: "API_KEY", value: canary })).status).toBe(201);
  expect((await t.api("POST", "/v1/vault/secrets", { name: "SPARE_KEY", value: canary })).status).toBe(201);
  const rule = await t.api("POST", "/v1/vault/rules", {
    host: h("api"),
    secret: "API_KEY",
    inject: { scheme: "bearer" },
  });
  expect(rule.status, rule.text).toBe(201);
  expect((await t.api("POST", "/v1/vault/hosts", { pattern: h("evil"), action: "block" })).status).toBe(200);
  const run = await newRun(t, spec ? { spec } : {});
  const seen = { count: 1, firstSeen: at(1), lastSeen: at(2) };
  const batch = auditBatch(run.id, {
    blockedHosts: [{ host: h("evil"), ...seen }],
    egressRoutes: [
      ...["api", "pypi", "other"].map((n) => ({ host: h(n), route: "direct" as const, ...seen })),
      { host: h("evil"), route: "refused" as const, ...seen },
      // Reached twice by two routes: still one host.
      { host: h("pypi"), route: "refused" as const, ...seen },
    ],
  });
  expect((await postBatch(run, batch)).status).toBe(204);
  const responses: [string, ApiResponse][] = [];
  const dry = async (body: unknown) => {
    const res = await t.api("POST", "/v1/vault/dry-run", body);
    responses.push([JSON.stringify(body), res]);
    return res;
  };
  return { t, tag, run, canary, responses, dry, h };
}

/** The current vault as a draft (what GET /v1/vault/rules and /hosts show, minus implicit entries). */
function currentAsDraft(f: Fixture) {
  return {
    default: "allow",
    hosts: [{ pattern: f.h("evil"), action: "block" }],
    rules: [{ host: f.h("api"), secret: "API_KEY", inject: { scheme: "bearer" } }],
  };
}

const allow = (rule: number | null = null, route = "direct") => ({
  action: "allow",
  rule,
  route,
  methods: null,
  paths: null,
});
const block = (route = "direct") => ({ action: "block", rule: null, route, methods: null, paths: null });

/** The fixture's rule as the dry run shows it: the default placeholder variable, no limits. */
const apiRule = (f: Fixture) => ({
  index: 0,
  host: f.h("api"),
  secret: "API_KEY",
  placeholderEnv: "API_KEY",
  placeholderIn: [],
  methods: null,
  paths: null,
});

async function expectNoLeak(f: Fixture) {
  const needles = await leakNeedles(f.canary);
  const leaks = f.responses.flatMap(([where, res]) => findNeedles(where, responseText(res), needles));
  expect(leaks).toEqual([]);
}

describe("POST /v1/vault/dry-run", { timeout: 60_000 }, () => {
  it("a draft with a block default: the reached hosts it would refuse change, routing becomes catch-all (block_default)", async () => {
    const f = await fixture();
    const version = (await f.t.api("GET", "/v1/vault/settings")).json.version;
    const res = await f.dry({ runId: f.run.id, draft: { ...currentAsDraft(f), default: "block" } });
    expect(res.status, res.text).toBe(200);
    expect(res.json).toEqual({
      runId: f.run.id,
      // Changed first, then by name.
      hosts: [
        { host: f.h("other"), draft: block(), current: allow(), changed: true },
        { host: f.h("pypi"), draft: block(), current: allow(), changed: true },
        // The rule's host keeps its implicit allow entry, and its rule.
        { host: f.h("api"), draft: allow(0), current: allow(0), changed: false },
        { host: f.h("evil"), draft: block(), current: block(), changed: false },
      ],
      routing: {
        draft: { mode: "catch-all", reasons: ["block_default"] },
        current: { mode: "default", reasons: [] },
      },
      rules: { draft: [apiRule(f)], current: [apiRule(f)] },
      placeholders: {
        draft: [{ env: "API_KEY", secret: "API_KEY" }],
        current: [{ env: "API_KEY", secret: "API_KEY" }],
      },
      counts: { hosts: 4, changed: 2 },
      truncated: false,
    });
    // The current side is what the preview shows now.
    const preview = await f.t.api("GET", "/v1/vault/policy-preview");
    expect(res.json.routing.current).toEqual(preview.json.routing);
    // Nothing was written.
    expect((await f.t.api("GET", "/v1/vault/settings")).json.version).toBe(version);

    // An exact block of a reached host: its action changes, routing stays default.
    const exact = await f.dry({
      runId: f.run.id,
      changes: { hosts: { upsert: [{ pattern: f.h("pypi"), action: "block" }] } },
    });
    expect(exact.json.hosts[0]).toEqual({
      host: f.h("pypi"),
      draft: block(),
      current: allow(),
      changed: true,
    });
    expect(exact.json.counts).toEqual({ hosts: 4, changed: 1 });
    expect(exact.json.routing.draft).toEqual({ mode: "default", reasons: [] });
    await expectNoLeak(f);
  });

  it("a rule added: the host shows the rule's index (secret by name only, never its value); a blocked host gets no rule", async () => {
    const f = await fixture();
    const res = await f.dry({
      runId: f.run.id,
      changes: {
        rules: {
          add: [{ host: f.h("pypi"), secret: "SPARE_KEY", inject: { scheme: "raw", name: "X-Api-Key" } }],
        },
      },
    });
    expect(res.status, res.text).toBe(200);
    expect(res.json.hosts).toEqual([
      { host: f.h("pypi"), draft: allow(1), current: allow(), changed: true },
      { host: f.h("api"), draft: allow(0), current: allow(0), changed: false },
      { host: f.h("evil"), draft: block(), current: block(), changed: false },
      { host: f.h("other"), draft: allow(), current: allow(), changed: false },
    ]);
    expect(res.json.routing.draft).toEqual({ mode: "default", reasons: [] });

    // A wildcard rule first in a draft: every host under the tag gets it but the blocked one,
    // the old rule is now rule 1 (renumbered, but not changed), and routing is catch-all.
    const draft = currentAsDraft(f);
    draft.rules.unshift({ host: `*.${f.tag}.example`, secret: "SPARE_KEY", inject: { scheme: "bearer" } });
    const wild = await f.dry({ runId: f.run.id, draft });
    expect(wild.status, wild.text).toBe(200);
    expect(wild.json.hosts).toEqual([
      // The exact rule's host: the first matching rule in order is the wildcard now.
      { host: f.h("api"), draft: allow(0), current: allow(0), changed: true },
      { host: f.h("other"), draft: allow(0), current: allow(), changed: true },
      { host: f.h("pypi"), draft: allow(0), current: allow(), changed: true },
      { host: f.h("evil"), draft: block(), current: block(), changed: false },
    ]);
    expect(wild.json.routing.draft).toEqual({ mode: "catch-all", reasons: ["wildcard_rule"] });

    // Reordering alone: rule numbers move, nothing is treated differently.
    const same = currentAsDraft(f);
    same.rules.push({ host: f.h("pypi"), secret: "SPARE_KEY", inject: { scheme: "bearer" } });
    same.rules.reverse();
    const moved = await f.dry({ runId: f.run.id, draft: same });
    const api = moved.json.hosts.find((x: { host: string }) => x.host === f.h("api"));
    expect(api).toEqual({ host: f.h("api"), draft: allow(1), current: allow(0), changed: false });

    for (const [, r] of f.responses) expect(r.text).not.toContain(f.canary);
    await expectNoLeak(f);
  });

  it("changes and the draft of the vault they make give the same answer", async () => {
    const f = await fixture();
    const added = { host: f.h("pypi"), secret: "SPARE_KEY", inject: { scheme: "query", name: "key" } };
    const viaChanges = await f.dry({
      runId: f.run.id,
      changes: {
        default: "block",
        hosts: { upsert: [{ pattern: f.h("other"), action: "allow" }], remove: [f.h("evil")] },
        // Rule 0 goes, and with it api's implicit entry: api falls to the block default.
        rules: { remove: [0], add: [added] },
      },
    });
    expect(viaChanges.status, viaChanges.text).toBe(200);
    const viaDraft = await f.dry({
      runId: f.run.id,
      draft: { default: "block", hosts: [{ pattern: f.h("other"), action: "allow" }], rules: [added] },
    });
    expect(viaDraft.status, viaDraft.text).toBe(200);
    expect(viaDraft.json).toEqual(viaChanges.json);
    expect(viaChanges.json.hosts).toEqual([
      { host: f.h("api"), draft: block(), current: allow(0), changed: true },
      { host: f.h("pypi"), draft: allow(0), current: allow(), changed: true },
      { host: f.h("evil"), draft: block(), current: block(), changed: false },
      { host: f.h("other"), draft: allow(), current: allow(), changed: false },
    ]);
    // No edits at all: the current vault against itself.
    const none = await f.dry({ runId: f.run.id, changes: {} });
    const asIs = await f.dry({ runId: f.run.id, draft: currentAsDraft(f) });
    expect(none.json).toEqual(asIs.json);
    expect(none.json.counts).toEqual({ hosts: 4, changed: 0 });
    await expectNoLeak(f);
  });

  it("a run that egresses through the user's machine: route tunnel, local_egress on both sides", async () => {
    const f = await fixture({ commands: ["true"], egress: "local" });
    const res = await f.dry({ runId: f.run.id, changes: {} });
    expect(res.status, res.text).toBe(200);
    expect(res.json.routing).toEqual({
      draft: { mode: "catch-all", reasons: ["local_egress"] },
      current: { mode: "catch-all", reasons: ["local_egress"] },
    });
    expect(res.json.hosts.map((x: { draft: { route: string } }) => x.draft.route)).toEqual([
      "tunnel",
      "tunnel",
      "tunnel",
      "tunnel",
    ]);
    // A run without audit rows replays nothing.
    const quiet = await newRun(f.t);
    expect((await f.dry({ runId: quiet.id, changes: {} })).json).toMatchObject({
      hosts: [],
      counts: { hosts: 0, changed: 0 },
      truncated: false,
    });
  });

  it("per-host routes: each host leaves by its deciding entry's via, else the run's egress", async () => {
    const f = await fixture();
    const pypi = await f.t.api("POST", "/v1/vault/hosts", {
      pattern: f.h("pypi"),
      action: "allow",
      via: "tunnel",
    });
    expect(pypi.status, pypi.text).toBe(200);
    const res = await f.dry({
      runId: f.run.id,
      changes: {
        hosts: {
          upsert: [
            { pattern: `*.${f.tag}.example`, action: "allow", via: "tunnel" },
            // An upsert replaces the entry: without via, the run's egress (direct) decides.
            { pattern: f.h("pypi"), action: "allow" },
          ],
        },
      },
    });
    expect(res.status, res.text).toBe(200);
    expect(res.json.routing).toEqual({
      draft: { mode: "catch-all", reasons: ["tunnel_host"] },
      current: { mode: "catch-all", reasons: ["tunnel_host"] },
    });
    expect(res.json.hosts).toEqual([
      // The wildcard decides for other.<tag> now; pypi's own entry lost its tunnel.
      { host: f.h("other"), draft: allow(null, "tunnel"), current: allow(), changed: true },
      { host: f.h("pypi"), draft: allow(), current: allow(null, "tunnel"), changed: true },
      // api's exact (implicit) entry decides, without a route of its own; evil stays blocked.
      { host: f.h("api"), draft: allow(0), current: allow(0), changed: false },
      { host: f.h("evil"), draft: block(), current: block(), changed: false },
    ]);
    await expectNoLeak(f);
  });

  it("per-host routes under local egress: a direct entry leaves direct, the rest through the tunnel", async () => {
    const f = await fixture({ commands: ["true"], egress: "local" });
    const res = await f.dry({
      runId: f.run.id,
      draft: {
        ...currentAsDraft(f),
        hosts: [...currentAsDraft(f).hosts, { pattern: f.h("pypi"), action: "allow", via: "direct" }],
      },
    });
    expect(res.status, res.text).toBe(200);
    const routes = Object.fromEntries(
      (res.json.hosts as { host: string; draft: { route: string }; current: { route: string } }[]).map(
        (h) => [h.host, [h.draft.route, h.current.route]],
      ),
    );
    expect(routes).toEqual({
      [f.h("api")]: ["tunnel", "tunnel"],
      [f.h("evil")]: ["tunnel", "tunnel"],
      [f.h("other")]: ["tunnel", "tunnel"],
      [f.h("pypi")]: ["direct", "tunnel"],
    });
    expect(res.json.counts).toEqual({ hosts: 4, changed: 1 });
    // A route on a block entry is refused as the vault refuses it.
    const bad = { pattern: f.h("pypi"), action: "block", via: "tunnel" };
    expectProblem(
      await f.dry({ runId: f.run.id, draft: { ...currentAsDraft(f), hosts: [bad] } }),
      400,
      "via_on_block",
    );
    expectProblem(
      await f.dry({ runId: f.run.id, changes: { hosts: { upsert: [bad] } } }),
      400,
      "via_on_block",
    );
  });

  it("bad bodies → 400/409 with the exact code, checked as the vault routes check them; nothing written", async () => {
    const f = await fixture();
    const before = {
      settings: (await f.t.api("GET", "/v1/vault/settings")).json,
      hosts: (await f.t.api("GET", "/v1/vault/hosts")).json,
      rules: (await f.t.api("GET", "/v1/vault/rules")).json,
    };
    const runId = f.run.id;
    const draft = currentAsDraft(f);
    const rule = (fields: Record<string, unknown>) => ({
      host: f.h("new"),
      secret: "API_KEY",
      inject: { scheme: "bearer" },
      ...fields,
    });
    const cases: [unknown, number, string][] = [
      // Exactly one of draft and changes.
      [{ runId, draft, changes: {} }, 400, "invalid_request"],
      [{ runId }, 400, "invalid_request"],
      [{ draft }, 400, "invalid_request"],
      [{ runId, changes: {}, environmentId: "env_x" }, 400, "unknown_field"],
      [{ runId, changes: { rules: { add: [rule({ position: 0 })] } } }, 400, "unknown_field"],
      [{ runId, draft: { ...draft, version: 7 } }, 400, "unknown_field"],
      [{ runId, draft: { hosts: [], rules: [] } }, 400, "invalid_request"],
      // Patterns, as POST /v1/vault/hosts and /rules check them.
      [
        { runId, draft: { ...draft, hosts: [{ pattern: "*", action: "block" }] } },
        400,
        "invalid_host_pattern",
      ],
      [
        { runId, draft: { ...draft, hosts: [{ pattern: "*.com", action: "block" }] } },
        400,
        "invalid_host_pattern",
      ],
      [
        { runId, changes: { hosts: { upsert: [{ pattern: "api.*.example", action: "block" }] } } },
        400,
        "invalid_host_pattern",
      ],
      [{ runId, changes: { rules: { add: [rule({ host: "*.github.io" })] } } }, 400, "invalid_host_pattern"],
      [
        { runId, changes: { rules: { add: [rule({ host: "münchen.example" })] } } },
        400,
        "invalid_host_pattern",
      ],
      [
        { runId, draft: { ...draft, hosts: [{ pattern: "a.example", action: "maybe" }] } },
        400,
        "invalid_request",
      ],
      // Secret names and inject specs.
      [{ runId, changes: { rules: { add: [rule({ secret: "NO_SUCH_SECRET" })] } } }, 400, "unknown_secret"],
      [{ runId, draft: { ...draft, rules: [rule({ secret: "no such" })] } }, 400, "invalid_request"],
      [{ runId, changes: { rules: { add: [rule({ inject: { scheme: "raw" } })] } } }, 400, "invalid_request"],
      [
        { runId, changes: { rules: { add: [rule({ inject: { scheme: "raw", name: "content-length" } })] } } },
        400,
        "invalid_request",
      ],
      [
        { runId, changes: { rules: { add: [rule({ inject: { scheme: "magic" } })] } } },
        400,
        "invalid_request",
      ],
      // Edits that do not fit the vault.
      [{ runId, changes: { rules: { remove: [1] } } }, 400, "invalid_request"],
      [{ runId, changes: { rules: { remove: [-1] } } }, 400, "invalid_request"],
      [{ runId, changes: { hosts: { remove: ["nothing.example"] } } }, 400, "invalid_request"],
      [
        {
          runId,
          draft: {
            ...draft,
            hosts: [
              { pattern: "a.example", action: "block" },
              { pattern: "A.example.", action: "allow" },
            ],
          },
        },
        400,
        "invalid_request",
      ],
      // The vault's own conflicts: an entry a rule needs, a rule for a blocked host.
      [{ runId, changes: { hosts: { remove: [f.h("api")] } } }, 409, "host_has_rule"],
      [
        { runId, changes: { hosts: { upsert: [{ pattern: `*.${f.tag}.example`, action: "block" }] } } },
        409,
        "rule_host_blocked",
      ],
      [{ runId, draft: { ...draft, rules: [rule({ host: f.h("evil") })] } }, 409, "rule_host_blocked"],
    ];
    const failures: string[] = [];
    for (const [body, status, code] of cases) {
      try {
        expectProblem(await f.dry(body), status, code);
      } catch (e) {
        failures.push(`${JSON.stringify(body)}: ${(e as Error).message}`);
      }
    }
    expect(failures).toEqual([]);
    expect({
      settings: (await f.t.api("GET", "/v1/vault/settings")).json,
      hosts: (await f.t.api("GET", "/v1/vault/hosts")).json,
      rules: (await f.t.api("GET", "/v1/vault/rules")).json,
    }).toEqual(before);
    await expectNoLeak(f);
  });

  it("another tenant's run → 404 not_found (as no run at all); nothing of theirs shows", async () => {
    const a = await fixture();
    const b = await fixture();
    for (const body of [
      { runId: b.run.id, changes: {} },
      { runId: b.run.id, draft: currentAsDraft(a) },
      { runId: "run_doesnotexist", changes: {} },
    ]) {
      const res = expectProblem(await a.dry(body), 404, "not_found");
      expect(res.text).not.toContain(b.tag);
    }
    expect((await b.dry({ runId: b.run.id, changes: {} })).status).toBe(200);
    await expectNoLeak(a);
  });

  it("limits and placeholder variables: shown per host and rule; a limit alone is a change", async () => {
    // case N3: the dry run shows the limits a run's requests would be held to.
    const f = await fixture();
    const res = await f.dry({
      runId: f.run.id,
      changes: {
        hosts: { upsert: [{ pattern: f.h("pypi"), action: "allow", methods: ["get", "HEAD"] }] },
        rules: {
          add: [
            {
              host: f.h("other"),
              secret: "SPARE_KEY",
              inject: { scheme: "bearer" },
              placeholderEnv: "OTHER_TOKEN",
              placeholderIn: ["body"],
              paths: ["/v1/"],
            },
          ],
        },
      },
    });
    expect(res.status, res.text).toBe(200);
    expect(res.json.hosts).toEqual([
      { host: f.h("other"), draft: allow(1), current: allow(), changed: true },
      {
        host: f.h("pypi"),
        draft: { ...allow(), methods: ["GET", "HEAD"] },
        current: allow(),
        changed: true,
      },
      { host: f.h("api"), draft: allow(0), current: allow(0), changed: false },
      { host: f.h("evil"), draft: block(), current: block(), changed: false },
    ]);
    expect(res.json.rules.draft).toEqual([
      apiRule(f),
      {
        index: 1,
        host: f.h("other"),
        secret: "SPARE_KEY",
        placeholderEnv: "OTHER_TOKEN",
        placeholderIn: ["body"],
        methods: null,
        paths: ["/v1/"],
      },
    ]);
    // case N1: the variables the run's sandboxes would get, the draft's and today's.
    expect(res.json.placeholders).toEqual({
      draft: [
        { env: "API_KEY", secret: "API_KEY" },
        { env: "OTHER_TOKEN", secret: "SPARE_KEY" },
      ],
      current: [{ env: "API_KEY", secret: "API_KEY" }],
    });

    // A rule's placeholder or limit changed alone changes its hosts' treatment.
    const draft = currentAsDraft(f);
    const [only] = draft.rules;
    if (!only) throw new Error("no rule");
    Object.assign(only, { placeholderEnv: null, methods: ["GET"] });
    const narrowed = await f.dry({ runId: f.run.id, draft });
    expect(narrowed.status, narrowed.text).toBe(200);
    expect(narrowed.json.hosts[0]).toEqual({
      host: f.h("api"),
      draft: allow(0),
      current: allow(0),
      changed: true,
    });
    expect(narrowed.json.rules.draft[0]).toMatchObject({ placeholderEnv: null, methods: ["GET"] });
    expect(narrowed.json.placeholders.draft).toEqual([]);
    await expectNoLeak(f);
  });

  it("a declared model's lane keeps its own variables: a rule's placeholder of that name is not given", async () => {
    const f = await fixture({ commands: ["true"], model: "judge" });
    const res = await f.dry({
      runId: f.run.id,
      changes: {
        rules: {
          add: [
            {
              host: f.h("other"),
              secret: "SPARE_KEY",
              inject: { scheme: "bearer" },
              placeholderEnv: "OPENAI_API_KEY",
            },
          ],
        },
      },
    });
    expect(res.status, res.text).toBe(200);
    expect(res.json.placeholders.draft).toEqual([{ env: "API_KEY", secret: "API_KEY" }]);
  });

  it("bad limits and placeholder variables → their codes, nothing written", async () => {
    const f = await fixture();
    const before = (await f.t.api("GET", "/v1/vault/settings")).json;
    const runId = f.run.id;
    const rule = (extra: Record<string, unknown>) => ({
      rules: { add: [{ host: f.h("other"), secret: "SPARE_KEY", inject: { scheme: "bearer" }, ...extra }] },
    });
    const cases: [unknown, string][] = [
      [{ runId, changes: rule({ methods: ["G T"] }) }, "invalid_limit"],
      [{ runId, changes: rule({ paths: ["/a/../b"] }) }, "invalid_limit"],
      [{ runId, changes: rule({ placeholderEnv: "PATH" }) }, "invalid_placeholder_env"],
      [{ runId, changes: rule({ placeholderEnv: "BW_TOKEN" }) }, "invalid_placeholder_env"],
      [
        {
          runId,
          changes: { hosts: { upsert: [{ pattern: f.h("pypi"), action: "block", methods: ["GET"] }] } },
        },
        "limits_on_block",
      ],
      [
        { runId, changes: { hosts: { upsert: [{ pattern: f.h("pypi"), action: "allow", paths: ["x"] }] } } },
        "invalid_limit",
      ],
    ];
    for (const [body, code] of cases) expectProblem(await f.dry(body), 400, code);
    expect((await f.t.api("GET", "/v1/vault/settings")).json).toEqual(before);
  });
});
