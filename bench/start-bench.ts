// The run start bench: `npm run bench:start`. How long a run takes to start on the local backend
// (scripts/lib/local-stack.ts, as the end-to-end tests run it: the host agent making namespaces,
// `wrangler dev` serving the API and the coordinator, a real PostgreSQL), from POST /v1/runs to
// the run's `running` transition and to its command's first output, for an empty vault (nothing
// to enforce: no proxy process) and for a vault with a rule (the proxy started, its policy
// fetched, the wiring step proving the redirect). A few runs of each, taking turns after one
// unmeasured run of each; median and p90, and the ratio with / without the proxy. Each run's start
// is broken down by phase (bench/lib/run-phases.ts: its trace, the proxy's ready time, the agent's
// creates) to show what the proxy adds, and where.
// Needs root (namespaces); skipped with a message otherwise. No network but loopback and the
// namespaces the agent makes (all removed when a run ends, and when the bench stops).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ApiClient as Api, apiClient as client } from "../scripts/lib/api-client";
import { startLocalStack } from "../scripts/lib/local-stack";
import { publish, summaryLines } from "./lib/page";
import { f, num, runBench, sectionHead } from "./lib/results";
import { AgentCreates, launchAndWait, startMarks } from "./lib/run-phases";
import { newTenant, newVaultKek, onStop, startDatabase, stopAll, whyNoLocalRuns } from "./lib/stack";
import { type StartKind, type StartResults, type StartSample, startSection } from "./lib/start-report";

const CONFIG = {
  /** Measured runs of each kind (after one unmeasured run of each). */
  runs: num("BENCH_START_RUNS", 5),
  /** How often the bench looks at a run, ms (the trace's own timestamps are what is measured). */
  pollMs: num("BENCH_START_POLL_MS", 100),
};
const SHORT = CONFIG.runs < 5;
const MARK = "bench-start-output";

const log = (s: string) => process.stderr.write(`${s}\n`);

/** One run: launched, watched to its end; the times come from its trace (and the agent's log). */
async function oneRun(api: Api, kind: StartKind, creates: AgentCreates): Promise<StartSample> {
  const launched = await launchAndWait(
    api,
    { commands: [`echo ${MARK}`] },
    { pollMs: CONFIG.pollMs, timeoutMs: 120_000 },
  );
  const { run } = launched;
  const marks = startMarks(launched, creates);
  const output = run.trace.find((e) => e.kind === "output" && typeof e.detail?.text === "string");
  const ok =
    run.status === "finished" &&
    run.reason === "completed" &&
    Boolean(output?.detail.text.includes(MARK)) &&
    (kind === "proxy") === Boolean(run.proof?.enforced);
  return {
    kind,
    runId: launched.runId,
    ok,
    status: `${run.status}/${run.reason}`,
    acceptedMs: launched.acceptedMs,
    toRunningMs: marks.running,
    toOutputMs: marks.firstOutput,
    toEndMs: marks.ended,
    marks,
  };
}

async function main(): Promise<number> {
  const why = whyNoLocalRuns("run start bench");
  if (why) {
    log(why);
    return 0;
  }
  const started = Date.now();
  const dir = mkdtempSync(join(tmpdir(), "bw-bench-start-"));
  onStop(async () => rmSync(dir, { recursive: true, force: true }));
  try {
    const db = await startDatabase();
    onStop(() => db.stop());
    log(`PostgreSQL ${db.version} up; starting the local stack (host agent, wrangler dev)`);
    const creates = new AgentCreates();
    const stack = await startLocalStack({
      databaseUrl: db.url,
      wsProxy: db.wsProxy,
      vaultKek: newVaultKek(),
      dir,
      agentStateDir: join(dir, "agent"),
      log: (line) => {
        creates.line(line);
        if (process.env.BENCH_VERBOSE || line.startsWith("[images]")) log(line);
      },
    });
    onStop(() => stack.stop());
    log(`local stack on ${stack.apiUrl}`);

    // Two tenants: one with an empty vault, one with a secret and a rule (so a proxy runs).
    const apis: Record<StartKind, Api> = {
      "no-proxy": client(stack.apiUrl, (await newTenant(db.url, "start")).key),
      proxy: client(stack.apiUrl, (await newTenant(db.url, "start")).key),
    };
    const must = (r: { status: number; text: string }, what: string) => {
      if (r.status >= 300) throw new Error(`${what}: ${r.status} ${r.text}`);
    };
    must(
      await apis.proxy.call("POST", "/v1/vault/secrets", { name: "BENCH_KEY", value: `bench-${Date.now()}` }),
      "secret",
    );
    must(
      await apis.proxy.call("POST", "/v1/vault/rules", {
        host: "api.bench.test",
        secret: "BENCH_KEY",
        inject: { scheme: "bearer" },
      }),
      "rule",
    );

    const kinds: StartKind[] = ["no-proxy", "proxy"];
    const samples: StartSample[] = [];
    for (let round = 0; round <= CONFIG.runs; round++) {
      for (const kind of kinds) {
        const s = await oneRun(apis[kind], kind, creates);
        const label = round === 0 ? "warm-up" : `${round}/${CONFIG.runs}`;
        log(
          `${kind} (${label}): running after ${f(s.toRunningMs, 0)} ms, first output after ${f(s.toOutputMs, 0)} ms, ` +
            `ended after ${f(s.toEndMs, 0)} ms (${s.status})${s.ok ? "" : " NOT AS EXPECTED"}`,
        );
        if (round > 0) samples.push(s);
      }
    }

    const results: StartResults = {
      ...sectionHead("start", started, SHORT),
      config: { ...CONFIG },
      postgres: db.version,
      samples,
    };
    const section = startSection(results);
    const written = publish(section);
    process.stdout.write(`\nrun start bench:\n${summaryLines(section)}\nwritten to ${written}\n`);
    const bad = samples.filter((s) => !s.ok);
    // Not a time: a run that did not start, or started without the proxy it should have.
    if (bad.length > 0) log(`FAILED: ${bad.length} runs did not go as expected`);
    return bad.length > 0 ? 1 : 0;
  } finally {
    await stopAll();
  }
}

runBench("run start bench", main);
