// The run start bench: `npm run bench:start`. How long a run takes to start on the local backend
// (scripts/lib/local-stack.ts, as the end-to-end tests run it: the host agent making namespaces,
// `wrangler dev` serving the API and the coordinator, a real PostgreSQL), from POST /v1/runs to
// the run's `running` transition and to its command's first output, for an empty vault (nothing
// to enforce: no proxy process) and for a vault with a rule (the proxy started, its policy
// fetched, the wiring step proving the redirect). A few runs of each, taking turns after one
// unmeasured run of each; median and p90, and the ratio with / without the proxy.
// Needs root (namespaces); skipped with a message otherwise. No network but loopback and the
// namespaces the agent makes (all removed when a run ends, and when the bench stops).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isTerminal } from "@benchwright/shared/contract/run-states";
import { proxyNamespaces } from "../local-agent/network";
import { type ApiClient as Api, apiClient as client } from "../scripts/lib/api-client";
import { whyNotRunnable } from "../scripts/lib/can-isolate";
import { startLocalStack } from "../scripts/lib/local-stack";
import { publish, summaryLines } from "./lib/page";
import { f, num, runBench, sectionHead } from "./lib/results";
import { newTenant, newVaultKek, onStop, startDatabase, stopAll, whyNoPostgres } from "./lib/stack";
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

// biome-ignore lint/suspicious/noExplicitAny: trace rows are JSON
type TraceEvent = { kind: string; state: string | null; detail: any; at: string };

/** One run: launched, watched to its end; the times come from its trace. */
async function oneRun(api: Api, kind: StartKind): Promise<StartSample> {
  const t0 = Date.now();
  const launched = await api.call("POST", "/v1/runs", { commands: [`echo ${MARK}`] });
  const acceptedMs = Date.now() - t0;
  if (launched.status !== 202) throw new Error(`launch: ${launched.status} ${launched.text}`);
  const id = launched.json.id as string;
  const deadline = Date.now() + 120_000;
  // biome-ignore lint/suspicious/noExplicitAny: the run's JSON
  let run: any;
  for (;;) {
    run = (await api.call("GET", `/v1/runs/${id}`)).json;
    if (isTerminal(run?.status)) break;
    if (Date.now() > deadline) throw new Error(`run ${id} did not end in 120 s: ${JSON.stringify(run)}`);
    await new Promise((r) => setTimeout(r, CONFIG.pollMs));
  }
  const trace = (run.trace ?? []) as TraceEvent[];
  const at = (e: TraceEvent | undefined) => (e ? Date.parse(e.at) - t0 : Number.NaN);
  const running = trace.find((e) => e.kind === "transition" && e.state === "running");
  const output = trace.find((e) => e.kind === "output" && typeof e.detail?.text === "string");
  const ok =
    run.status === "finished" &&
    run.reason === "completed" &&
    Boolean(output?.detail.text.includes(MARK)) &&
    (kind === "proxy") === Boolean(run.proof?.enforced);
  return {
    kind,
    runId: id,
    ok,
    status: `${run.status}/${run.reason}`,
    acceptedMs,
    toRunningMs: at(running),
    toOutputMs: at(output),
    toEndMs: Date.parse(run.endedAt ?? "") - t0,
  };
}

async function main(): Promise<number> {
  const why = whyNotRunnable() ?? whyNoPostgres();
  if (why) {
    log(
      `run start bench skipped: ${why} (it makes namespaces). Its section of bench/results is left as it was.`,
    );
    return 0;
  }
  // The host agent's nft table is the machine's: an agent that installs it while another agent's
  // run is live cuts that run off its relay. So never start beside another agent's runs.
  const others = proxyNamespaces();
  if (others.length > 0) {
    log(
      `run start bench skipped: another local agent has runs on this machine (${others.join(", ")}); ` +
        "two agents share the host's nft table. Run it when they are done.",
    );
    return 0;
  }
  const started = Date.now();
  const dir = mkdtempSync(join(tmpdir(), "bw-bench-start-"));
  onStop(async () => rmSync(dir, { recursive: true, force: true }));
  try {
    const db = await startDatabase();
    onStop(() => db.stop());
    log(`PostgreSQL ${db.version} up; starting the local stack (host agent, wrangler dev)`);
    const stack = await startLocalStack({
      databaseUrl: db.url,
      wsProxy: db.wsProxy,
      vaultKek: newVaultKek(),
      dir,
      agentStateDir: join(dir, "agent"),
      log: process.env.BENCH_VERBOSE ? (line) => log(line) : undefined,
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
        const s = await oneRun(apis[kind], kind);
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
