import { mkdirSync, writeFileSync } from "node:fs";
import { ProxyView } from "@benchwright/shared/contract/proxy-view";
import { expect, it } from "vitest";
import { until } from "../until";
import { demoVault, describeE2e, lastJson, newUser, nodeScript, stdoutOf } from "./harness";

// case F1, on real parts: a local run's command drives concurrent requests through its proxy to
// an injected host, an allowed host and a blocked host, while the whole control plane
// (`wrangler dev`: API, Durable Objects, the audit ingest) is stopped and started again. The
// proxy spools its audit batches meanwhile. After it: every row the proxy recorded was stored
// exactly once (0 lost, 0 doubled), and what is stored matches what the sandbox itself counted,
// host by host. `npm test` runs the short version; `npm run test:audit-load` the long one (more
// load, a longer outage), which also writes its counts to bench/results/audit-load.json.

const LONG = process.env.BW_AUDIT_LOAD === "long";
const LOAD_MS = LONG ? 180_000 : 20_000;
const CONCURRENCY = LONG ? 48 : 12;
/** The control plane goes away this long after the load started, for this long (plus its restart). */
const OUTAGE_AFTER_MS = LONG ? 20_000 : 2_000;
const OUTAGE_MS = LONG ? 60_000 : 5_000;
const LOAD = `
const targets = {
  api: "https://api.demo.test/v1/load",
  other: "https://other.demo.test/load",
  blocked: "https://blocked.demo.test/load",
};
const counts = { api: {}, other: {}, blocked: {} };
const names = Object.keys(targets);
let n = 0;
const end = Date.now() + ${LOAD_MS};
async function worker() {
  while (Date.now() < end) {
    const name = names[n++ % names.length];
    let key;
    try {
      const res = await fetch(targets[name]);
      await res.arrayBuffer();
      key = String(res.status);
    } catch (e) {
      key = "error:" + String(e.cause?.code ?? e.message);
    }
    counts[name][key] = (counts[name][key] ?? 0) + 1;
  }
}
console.log("load-started");
Promise.all(Array.from({ length: ${CONCURRENCY} }, worker)).then(() => {
  console.log(JSON.stringify({ load: true, counts }));
});
`;

const STACK = { name: "bwt-e2a", index: 86 };

describeE2e("audit completeness under load, across a control-plane outage", { start: STACK }, (e) => {
  it("stores every audit row the proxy recorded exactly once, and they match the sandbox's own counts", {
    timeout: LOAD_MS + 300_000,
  }, async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary, { default: "block" });
    const allow = await api.call("POST", "/v1/vault/hosts", { pattern: "other.demo.test", action: "allow" });
    expect(allow.status).toBe(200);
    // Lingering keeps the proxy after the command, so its own counters can be read.
    const launched = await api.call("POST", "/v1/runs", {
      commands: [nodeScript(LOAD)],
      lingerSeconds: 600,
    });
    expect(launched.status).toBe(202);
    const id = launched.json.id as string;
    await until(
      "the load to start",
      async () => stdoutOf((await api.call("GET", `/v1/runs/${id}`)).json).includes("load-started"),
      90_000,
      250,
    );
    // Mid-load, the control plane goes away for a while and comes back.
    await new Promise((r) => setTimeout(r, OUTAGE_AFTER_MS));
    const outageStart = Date.now();
    await e.stack.restartWorker(OUTAGE_MS);
    const outageMs = Date.now() - outageStart;

    const run = await until(
      "the run's commands to end (lingering)",
      async () => {
        const r = (await api.call("GET", `/v1/runs/${id}`)).json;
        if (["finished", "stopped", "failed"].includes(r.status))
          throw new Error(`ended: ${r.reason} ${r.reasonDetail}`);
        return r.status === "lingering" ? r : null;
      },
      LOAD_MS + 120_000,
      500,
    );
    // While lingering, the commands' outcome is the reason of the move to lingering.
    const lingered = run.trace.find(
      (t: { kind: string; state: string }) => t.kind === "transition" && t.state === "lingering",
    );
    expect(lingered?.reason).toBe("completed");
    const sandbox = lastJson(run) as { counts: Record<string, Record<string, number>> };
    const c = sandbox.counts;
    // The load went on through the outage: the proxy kept its policy; nothing errored.
    expect(Object.keys(c.api ?? {})).toEqual(["200"]);
    expect(Object.keys(c.other ?? {})).toEqual(["200"]);
    expect(Object.keys(c.blocked ?? {})).toEqual(["403"]);
    const made = { api: c.api?.["200"] ?? 0, other: c.other?.["200"] ?? 0, blocked: c.blocked?.["403"] ?? 0 };
    expect(made.api + made.other + made.blocked).toBeGreaterThan(300);

    // The proxy delivered everything it recorded (its spool drained after the outage).
    const view = await until(
      "the proxy's spool to drain",
      async () => {
        const look = await api.call("GET", `/v1/runs/${id}/proxy`);
        if (look.status !== 200) return null;
        const v = ProxyView.parse(look.json.view);
        return v.audit.pendingBatches === 0 && v.audit.rowsSent === v.audit.rowsRecorded ? v : null;
      },
      90_000,
      1_000,
    );
    expect(view.audit).toMatchObject({
      rowsRejected: 0,
      rowsRefused: 0,
      batchesRejected: 0,
      accepting: true,
    });

    // Stored, through the public API: host by host equal to the sandbox's counts; in all, equal
    // to what the proxy recorded (the wiring probe's rows included).
    const routes = (await api.call("GET", `/v1/runs/${id}/egress-routes?limit=100`)).json.egressRoutes as {
      host: string;
      route: string;
      count: number;
    }[];
    const blocked = (await api.call("GET", `/v1/runs/${id}/blocked-hosts?limit=100`)).json.blockedHosts as {
      host: string;
      seenCount: number;
    }[];
    const route = (host: string, r: string) =>
      routes.find((x) => x.host === host && x.route === r)?.count ?? 0;
    expect(route("api.demo.test", "direct")).toBe(made.api);
    expect(route("other.demo.test", "direct")).toBe(made.other);
    expect(route("blocked.demo.test", "refused")).toBe(made.blocked);
    expect(blocked.find((b) => b.host === "blocked.demo.test")?.seenCount).toBe(made.blocked);
    const stored = routes.reduce((a, r) => a + r.count, 0) + blocked.reduce((a, b) => a + b.seenCount, 0);
    expect(stored).toBe(view.audit.rowsRecorded);
    const summary = {
      load: LONG ? "long" : "short",
      loadSeconds: LOAD_MS / 1000,
      concurrency: CONCURRENCY,
      outageSeconds: Math.round(outageMs / 100) / 10,
      requests: made,
      rowsRecorded: view.audit.rowsRecorded,
      rowsStored: stored,
      lost: view.audit.rowsRecorded - stored,
      batchesSent: view.audit.batchesSent,
    };
    console.log(`audit-load: ${JSON.stringify(summary)}`);
    if (LONG) {
      mkdirSync("bench/results", { recursive: true });
      const at = { date: new Date().toISOString() };
      writeFileSync("bench/results/audit-load.json", `${JSON.stringify({ ...at, ...summary }, null, 2)}\n`);
    }

    await api.call("POST", `/v1/runs/${id}/linger`, { seconds: 0 });
  });
});
