// The setup images bench: `npm run bench:setup` (issue 34, item 8). A benchmark of 8 tasks whose
// setup makes a venv, pip-installs a few generated packages from the demo index through the run's
// proxy and byte-compiles them (at least 10 s, padded with sleep only if it is quicker), run on
// the local backend (scripts/lib/local-stack.ts, as the end-to-end tests run it) in six ways, the
// kinds taking turns in each round:
//   (1) 1 task, cold            (2) 8 tasks, cold            → (2)/(1) ≤ 1.3, wall time
//   (3) 8 tasks, `setupImage: "rebuild"`                    (4) 8 tasks with 8 task setups (the old cost)
//   (5) 8 tasks again, warm     (6) the same commands, no setup, same vault → (5)/(6) ≤ 1.2, first output
// Cold runs get a fresh environment (tenant); (3), (5) and (6) run in (2)'s. p50 over
// BENCH_SETUP_ROUNDS rounds. Needs root (namespaces) and PostgreSQL; skipped with a message
// otherwise. No network but loopback, the demo upstream's namespace and the agent's (all removed
// when the bench stops), and the setup layers its runs made (dropped through the agent).
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ApiClient as Api, apiClient as client } from "../scripts/lib/api-client";
import { type DemoUpstream, startDemoUpstream } from "../scripts/lib/demo-upstream";
import { type LocalStack, startLocalStack } from "../scripts/lib/local-stack";
import { buildWheel, generatedPackages, INDEX_HOST, pipIndexRoutes } from "../scripts/lib/pip-index";
import { publish, summaryLines } from "./lib/page";
import { f, num, quantiles, runBench, sectionHead } from "./lib/results";
import { AgentCreates, type Launched, launchAndWait, type RunJson, startMarks } from "./lib/run-phases";
import { type SetupKind, type SetupResults, type SetupSample, setupSection } from "./lib/setup-report";
import { newTenant, newVaultKek, onStop, startDatabase, stopAll, whyNoLocalRuns } from "./lib/stack";

const CONFIG = {
  /** Rounds; each runs every kind once. */
  rounds: num("BENCH_SETUP_ROUNDS", 3),
  /** Tasks of the benchmark (each with its own sandbox, beside the work sandbox). */
  tasks: 8,
  /** Generated packages the setup installs, and modules in each. */
  packages: 6,
  modules: 20,
  /** The least the setup takes; a quicker one is padded with sleep (reported). */
  minSetupS: num("BENCH_SETUP_MIN_S", 10),
  /** How often the bench looks at a run, ms (the trace's own timestamps are what is measured). */
  pollMs: num("BENCH_SETUP_POLL_MS", 1000),
};
const SHORT = CONFIG.rounds < 3 || CONFIG.minSetupS < 10;
/** The longest one run may take (a cold 8-task run on current main runs 9 setups at once). */
const RUN_TIMEOUT_MS = 900_000;
const MARK = "bench-setup-output";
const SETUP_MARK = "bench-setup-work";
/** The demo upstream's namespace (its own name and /30: beside `npm start` and the tests'). */
const UPSTREAM = { name: "bwbsetup", index: 211 };

const log = (s: string) => process.stderr.write(`${s}\n`);

const PACKAGES = generatedPackages(CONFIG.packages, CONFIG.modules).map((pkg) => ({
  pkg,
  wheel: buildWheel(pkg),
}));
const IMPORTS = PACKAGES.map((p) => p.pkg.name).join(", ");

/**
 * The setup: a venv, the packages by version and hash from the demo index (pip goes through the
 * run's proxy; it trusts the run CA through the wiring's REQUESTS_CA_BUNDLE), byte-compiled; it
 * prints its own time, then sleeps `padMs`. One command, so one setup image key per run setup.
 */
function setupCommand(padMs: number): string {
  const requirements = PACKAGES.map((p) => `${p.pkg.name}==${p.pkg.version} --hash=sha256:${p.wheel.sha256}`);
  return [
    "set -eu",
    "t0=$(date +%s%N)",
    "python3 -m venv .venv",
    "cat > /tmp/bench-requirements.txt <<'EOF'",
    ...requirements,
    "EOF",
    `PIP_INDEX_URL=https://${INDEX_HOST}/simple/ PIP_DISABLE_PIP_VERSION_CHECK=1 .venv/bin/pip install -q --no-cache-dir --no-compile --require-hashes -r /tmp/bench-requirements.txt`,
    ".venv/bin/python -m compileall -q .venv/lib",
    `echo "${SETUP_MARK} work_ms=$(( ($(date +%s%N) - t0) / 1000000 ))"`,
    ...(padMs > 0 ? [`sleep ${f(padMs / 1000, 1)}`] : []),
  ].join("\n");
}

/** Every sandbox's command: a line, then (where setup made the venv) the packages imported. */
const command = (name: string) =>
  `echo ${MARK} ${name}; if [ -d .venv ]; then .venv/bin/python -c "import ${IMPORTS}; print('${MARK} ${name} imports ok')"; fi`;

const taskName = (i: number) => `task-${i}`;

/** The run spec of each kind (`setup`: the setup command every sandbox runs; none for no-setup). */
function specOf(kind: SetupKind, setup: string): Record<string, unknown> {
  const tasks = kind === "one-cold" ? 1 : CONFIG.tasks;
  return {
    commands: [command("work")],
    ...(kind === "no-setup" ? {} : { setup: [setup] }),
    ...(kind === "rebuild" ? { setupImage: "rebuild" } : {}),
    tasks: Array.from({ length: tasks }, (_, i) => ({
      name: taskName(i),
      commands: [command(taskName(i))],
      // A task setup of its own makes each task's key its own: nothing is shared.
      ...(kind === "distinct" ? { setup: [`echo distinct setup of ${taskName(i)}`] } : {}),
    })),
  };
}

const DIGEST = "sha256:[0-9a-f]{64}";
const BUILT = new RegExp(`[Ss]etup image (${DIGEST}) built now`);
// The coordinator says it once per sandbox as it is made ("… starts from setup image …"); the
// seal's own row ("started from …") is the same sandbox again and is not counted.
const STARTED_FROM = new RegExp(`starts from setup image (${DIGEST})`);
const BUILT_BY = /built by run ([A-Za-z0-9_-]+)/;

/** What a run did about its setup, from its trace: where setup ran, which images it built and used. */
function setupFacts(run: RunJson) {
  const setupRan = new Set<string>();
  const work: number[] = [];
  const built = new Set<string>();
  let used = 0;
  const builtBy = new Set<string>();
  const other = new Set<string>();
  for (const e of run.trace) {
    const d = e.detail;
    if (e.kind === "output" && d?.stage === "setup") {
      if ("exitCode" in d) setupRan.add(String(d.sandbox));
      const m = typeof d.text === "string" ? new RegExp(`${SETUP_MARK} work_ms=(\\d+)`).exec(d.text) : null;
      if (m) work.push(Number(m[1]));
    }
    if (e.kind === "note" && typeof d?.text === "string") {
      const b = BUILT.exec(d.text);
      if (b) built.add(b[1] as string);
      if (STARTED_FROM.test(d.text)) {
        used += 1;
        const by = BUILT_BY.exec(d.text);
        if (by) builtBy.add(by[1] as string);
      }
      // Why setup ran uncached (no image for this backend, a lost build…): said once, kept as said.
      if (!b && !STARTED_FROM.test(d.text) && d.stage === "setup_image") other.add(d.text);
    }
  }
  return {
    setupRanIn: setupRan.size,
    work,
    built: [...built],
    used,
    builtBy: [...builtBy],
    imageNotes: [...other],
  };
}

/** Everything a sandbox's commands printed on stdout. */
const stdoutOf = (run: RunJson, name: string) =>
  run.trace
    .filter(
      (e) =>
        e.kind === "output" &&
        e.detail?.stream === "stdout" &&
        e.detail?.stage !== "setup" &&
        e.detail?.name === name,
    )
    .map((e) => e.detail.text as string)
    .join("");

interface Bench {
  stack: LocalStack;
  upstream: DemoUpstream;
  creates: AgentCreates;
  /** Every setup image digest the runs built (dropped from the agent when the bench stops). */
  digests: Set<string>;
}

async function oneRun(
  b: Bench,
  api: Api,
  kind: SetupKind,
  round: number,
  setup: string,
): Promise<SetupSample> {
  const spec = specOf(kind, setup);
  const seenBefore = b.upstream.seen.length;
  const launched: Launched = await launchAndWait(api, spec, {
    pollMs: CONFIG.pollMs,
    timeoutMs: RUN_TIMEOUT_MS,
  });
  const { run } = launched;
  const marks = startMarks(launched, b.creates);
  const facts = setupFacts(run);
  for (const d of facts.built) b.digests.add(d);
  const names = ["work", ...(spec.tasks as Array<{ name: string }>).map((t) => t.name)];
  const printed = names.every((n) => {
    const out = stdoutOf(run, n);
    return out.includes(`${MARK} ${n}`) && (kind === "no-setup" || out.includes(`${MARK} ${n} imports ok`));
  });
  return {
    kind,
    round,
    runId: launched.runId,
    ok: run.status === "finished" && run.reason === "completed" && Boolean(run.proof?.enforced) && printed,
    status: `${run.status}/${run.reason}`,
    sandboxes: names.length,
    acceptedMs: launched.acceptedMs,
    firstOutputMs: marks.firstOutput,
    wallMs: marks.ended,
    marks,
    setupRanIn: facts.setupRanIn,
    imagesBuilt: facts.built.length,
    imagesUsed: facts.used,
    builtBy: facts.builtBy,
    wheelDownloads: b.upstream.seen
      .slice(seenBefore)
      .filter((s) => s.host === INDEX_HOST && String(s.path).startsWith("/files/")).length,
    setupWorkMs: facts.work,
    notes: (run.notes ?? []).map((n) => n.code),
    imageNotes: facts.imageNotes,
  };
}

/** A fresh environment whose vault blocks by default and allows the index (catch-all: a proxy runs). */
async function newEnvironment(b: Bench, databaseUrl: string): Promise<Api> {
  const api = client(b.stack.apiUrl, (await newTenant(databaseUrl, "setup")).key);
  const must = (r: { status: number; text: string }, what: string) => {
    if (r.status >= 300) throw new Error(`${what}: ${r.status} ${r.text}`);
  };
  must(await api.call("PUT", "/v1/vault/settings", { default: "block" }), "vault default");
  must(await api.call("POST", "/v1/vault/hosts", { pattern: INDEX_HOST, action: "allow" }), "index host");
  return api;
}

/** Drops the setup layers the bench's runs built from the agent's store (they outlive its database). */
async function dropLayers(b: Bench): Promise<void> {
  for (const digest of b.digests) {
    await fetch(`${b.stack.agent.url}/v1/layers/${encodeURIComponent(digest)}`, {
      method: "DELETE",
      headers: { authorization: `Bearer ${b.stack.agentSecret}` },
    }).catch(() => {});
  }
}

const describe = (s: SetupSample) =>
  `end ${f(s.wallMs / 1000, 1)} s, first output ${f(s.firstOutputMs / 1000, 1)} s; setup ran in ${s.setupRanIn} of ${s.sandboxes}, ` +
  `images built ${s.imagesBuilt} / started from ${s.imagesUsed}, ${s.wheelDownloads} wheel downloads (${s.status})${s.ok ? "" : " NOT AS EXPECTED"}`;

async function main(): Promise<number> {
  const why = whyNoLocalRuns("setup images bench");
  if (why) {
    log(why);
    return 0;
  }
  const started = Date.now();
  const dir = mkdtempSync(join(tmpdir(), "bw-bench-setup-"));
  onStop(async () => rmSync(dir, { recursive: true, force: true }));
  try {
    const db = await startDatabase();
    onStop(() => db.stop());
    const upstream = await startDemoUpstream({
      ...UPSTREAM,
      hosts: [],
      expectedKey: randomBytes(12).toString("hex"),
      static: pipIndexRoutes(INDEX_HOST, PACKAGES),
    });
    onStop(() => upstream.stop());
    log(`PostgreSQL ${db.version} up, demo index on ${upstream.address}; starting the local stack`);
    const creates = new AgentCreates();
    const stack = await startLocalStack({
      databaseUrl: db.url,
      wsProxy: db.wsProxy,
      vaultKek: newVaultKek(),
      dir,
      agentStateDir: join(dir, "agent"),
      agentLayersDir: join(dir, "setup-layers"),
      proxyTestEnv: {
        // The demo upstream's own test CA, address and routes: test-only proxy settings.
        BW_TEST_EXTRA_CA_PEM: upstream.caPem,
        BW_TEST_ROUTES: upstream.hosts.map((h) => `${h}=${upstream.address}:${upstream.httpsPort}`).join(","),
        BW_TEST_ALLOW_CIDRS: upstream.cidr,
        BW_SPLICE: "off",
      },
      log: (line) => {
        creates.line(line);
        if (process.env.BENCH_VERBOSE || line.startsWith("[images]")) log(line);
      },
    });
    onStop(() => stack.stop());
    const b: Bench = { stack, upstream, creates, digests: new Set() };
    onStop(() => dropLayers(b)); // before the stack stops (stops run in reverse)
    log(`local stack on ${stack.apiUrl}`);

    // Unmeasured: the first run after start is slow, and it measures the setup's own time.
    const first = await oneRun(b, await newEnvironment(b, db.url), "one-cold", 0, setupCommand(0));
    const workMs = quantiles(first.setupWorkMs).median;
    if (!first.ok || !Number.isFinite(workMs)) throw new Error(`the first run failed: ${describe(first)}`);
    const padMs = Math.max(0, Math.ceil((CONFIG.minSetupS * 1000 - workMs) / 500) * 500);
    log(
      `unmeasured run ${first.runId}: setup work ${f(workMs / 1000, 1)} s` +
        (padMs > 0 ? `, padded with sleep ${f(padMs / 1000, 1)} s` : "") +
        `; ${describe(first)}`,
    );
    const setup = setupCommand(padMs);

    const samples: SetupSample[] = [];
    for (let round = 1; round <= CONFIG.rounds; round++) {
      const shared = await newEnvironment(b, db.url);
      const order: Array<[SetupKind, Api]> = [
        ["one-cold", await newEnvironment(b, db.url)],
        ["eight-cold", shared],
        ["warm", shared],
        ["no-setup", shared],
        ["rebuild", shared],
        ["distinct", await newEnvironment(b, db.url)],
      ];
      for (const [kind, api] of order) {
        const s = await oneRun(b, api, kind, round, setup);
        log(`${kind} (${round}/${CONFIG.rounds}) ${s.runId}: ${describe(s)}`);
        samples.push(s);
      }
    }

    const results: SetupResults = {
      ...sectionHead("setup", started, SHORT),
      config: { ...CONFIG },
      postgres: db.version,
      calibration: { runId: first.runId, workMs, padMs },
      samples,
    };
    const section = setupSection(results);
    const written = publish(section);
    process.stdout.write(`\nsetup images bench:\n${summaryLines(section)}\nwritten to ${written}\n`);
    const bad = samples.filter((s) => !s.ok);
    // Not a time: a run that did not finish, or whose sandboxes did not all print and import.
    if (bad.length > 0) log(`FAILED: ${bad.length} runs did not go as expected`);
    return bad.length > 0 ? 1 : 0;
  } finally {
    await stopAll();
  }
}

runBench("setup images bench", main);
