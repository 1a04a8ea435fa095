// `npm start`: the whole boundary on this machine, and a demo run through it.
//
// An embedded Postgres (PGlite, data in .data/pglite) unless DATABASE_URL is set, the committed
// migrations, a dev user with an API key, the local host agent (sandboxes as Linux namespaces),
// `wrangler dev` serving the API on http://127.0.0.1:8787, and a demo upstream in a namespace of
// its own. Then a demo run: its script calls the demo API host without a key and tries a blocked
// host; the proxy injects the key and refuses the block; the summary says what happened.
import { randomBytes } from "node:crypto";
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { isTerminal } from "@benchwright/shared/contract/run-states";
import { eq } from "drizzle-orm";
import { noSecretInDemoEnv } from "../cli/src/commands/demo";
import { packFolder } from "../cli/src/pack";
import { provisionApiKey } from "../src/auth/provision";
import { hashApiKey } from "../src/crypto/api-keys";
import { apiKeys } from "../src/db/schema";
import { whyNotRunnable } from "./lib/can-isolate";
import { type DemoUpstream, startDemoUpstream } from "./lib/demo-upstream";
import { startLocalStack } from "./lib/local-stack";
import { applyMigrations } from "./lib/migrate";
import { configureNeonForNode, nodeDb } from "./lib/neon-node";
import { startEmbeddedPostgres } from "./lib/pglite-bridge";
import { benchIndexRoutes, INDEX_HOST } from "./lib/pip-index";
import { startWorkerDev } from "./lib/worker-dev";

const DATA = join(process.cwd(), ".data");
const PORT = Number(process.env.PORT ?? 8787);
const DEV_EMAIL = "dev@localhost";
// The example's judge (an ordinary rule, its key read from the environment) and its read-only
// dataset host are served by the same upstream.
const DEMO_HOSTS = ["api.demo.test", "blocked.demo.test", "judge.demo.test", "data.demo.test"];

function readOrCreate(file: string, make: () => string): string {
  const path = join(DATA, file);
  if (existsSync(path)) return readFileSync(path, "utf8").trim();
  const value = make();
  writeFileSync(path, `${value}\n`, { mode: 0o600 });
  return value;
}

async function main() {
  // Private: the database files and keys must not be readable by a sandbox's uid.
  mkdirSync(DATA, { recursive: true, mode: 0o700 });
  chmodSync(DATA, 0o700);
  const stops: Array<() => Promise<void>> = [];
  const shutdown = async (code = 0) => {
    for (const stop of stops.reverse()) await stop().catch(() => {});
    process.exit(code);
  };
  process.on("SIGINT", () => void shutdown());
  process.on("SIGTERM", () => void shutdown());

  let databaseUrl = process.env.DATABASE_URL;
  let wsProxy = "";
  if (!databaseUrl) {
    const pg = await startEmbeddedPostgres(join(DATA, "pglite"));
    stops.push(() => pg.stop());
    databaseUrl = pg.url;
    wsProxy = pg.wsProxy;
  }
  configureNeonForNode(wsProxy || undefined);
  await applyMigrations(databaseUrl);
  const devKey = await devApiKey(databaseUrl);
  const kek =
    process.env.VAULT_KEK ?? readOrCreate("vault-kek", () => `dev1:${randomBytes(32).toString("base64")}`);

  // Sandboxes need root on Linux with ip, nft, unshare, nsenter and setpriv. Without them the
  // API still runs, and a run stops with the reason: nothing ever runs unisolated.
  const cannot = whyNotRunnable();
  let upstream: DemoUpstream | null = null;
  let base: string;
  const demoKey = `demo-key-${randomBytes(12).toString("hex")}`;
  if (cannot === null) {
    upstream = await startDemoUpstream({
      name: "bwdemo",
      index: 200,
      hosts: DEMO_HOSTS,
      expectedKey: demoKey,
      // The package index examples/qa-bench installs from (pypi.demo.test).
      static: benchIndexRoutes(),
    });
    stops.push(() => (upstream as DemoUpstream).stop());
    const stack = await startLocalStack({
      databaseUrl,
      wsProxy,
      vaultKek: kek,
      dir: DATA,
      port: PORT,
      agentStateDir: join(DATA, "agent"),
      // Kept with the embedded database's records of them, so a later start reuses them.
      agentLayersDir: join(DATA, "setup-layers"),
      proxyTestEnv: {
        // The demo upstream's own test CA and address: development-only proxy settings.
        BW_TEST_EXTRA_CA_PEM: upstream.caPem,
        BW_TEST_ROUTES: upstream.hosts
          .map((h) => `${h}=${upstream?.address}:${upstream?.httpsPort}`)
          .join(","),
        BW_TEST_ALLOW_CIDRS: upstream.cidr,
        // The sandboxes do not trust the demo CA, so a spliced host (its own certificate) would
        // fail: terminate every host in the demo.
        BW_SPLICE: "off",
      },
      log: process.env.BW_VERBOSE ? (line) => console.log(line) : undefined,
    });
    stops.push(() => stack.stop());
    base = stack.apiUrl;
  } else {
    const worker = await startWorkerDev({
      port: PORT,
      envFile: join(DATA, "worker.vars"),
      persistTo: join(DATA, "wrangler-state"),
      secrets: {
        DATABASE_URL: databaseUrl,
        VAULT_KEK: kek,
        COMPUTE_BACKEND_SECRET: randomBytes(32).toString("base64url"),
      },
      vars: { DATABASE_WS_PROXY: wsProxy, COMPUTE_BACKEND_URL: "" },
      log: process.env.BW_VERBOSE ? (line) => console.log(`[wrangler] ${line}`) : undefined,
    });
    stops.push(() => worker.stop());
    base = worker.url;
  }

  console.log(`
Benchwright boundary is up (database: ${wsProxy ? "embedded PGlite in .data/pglite" : "DATABASE_URL"}).
  API        ${base}/v1
  OpenAPI    ${base}/v1/openapi.json
  Dev user   ${DEV_EMAIL}
  API key    in .data/dev-api-key (0600; as a curl header in .data/dev-auth-header)
`);
  if (cannot !== null || !upstream) {
    console.log(`No demo run: this machine cannot make sandboxes (${cannot}).
Runs launched here stop with that reason; run \`npm start\` as root on Linux with iproute2,
nftables and util-linux installed to see one go through the boundary.
`);
    return;
  }
  await demo(base, devKey, demoKey, upstream);
  const exampleKey = await devApiKey(databaseUrl, EXAMPLE_ENVIRONMENT);
  await example(base, exampleKey, demoKey, upstream);
  console.log("The API keeps running; Ctrl-C stops it and removes every sandbox and namespace.");
}

/**
 * The example benchmark runs in an environment of its own (the dev user's second): its vault
 * blocks by default (catch-all routing, so the setup stage's package install must go through the
 * proxy to an allowed index), while the first demo shows default routing.
 */
const EXAMPLE_ENVIRONMENT = "examples";

async function devApiKey(databaseUrl: string, environment = "default"): Promise<string> {
  // Kept (0600) in .data so a restart keeps the same key; the database keeps only its hash.
  const { db, pool } = nodeDb(databaseUrl);
  try {
    const file = join(DATA, environment === "default" ? "dev-api-key" : `dev-api-key-${environment}`);
    const kept = existsSync(file) ? readFileSync(file, "utf8").trim() : "";
    const known = kept
      ? await db
          .select({ id: apiKeys.id })
          .from(apiKeys)
          .where(eq(apiKeys.hash, await hashApiKey(kept)))
      : [];
    const key =
      known.length > 0
        ? kept
        : (await provisionApiKey(db, { email: DEV_EMAIL, environment, keyName: "npm start" })).key;
    writeFileSync(file, `${key}\n`, { mode: 0o600 });
    // The same key as a header for `curl -H @file` (case K5): the commands printed below name the
    // file, so the key is never on a command line or in the terminal's scrollback.
    writeFileSync(`${file.replace("dev-api-key", "dev-auth-header")}`, `authorization: Bearer ${key}\n`, {
      mode: 0o600,
    });
    return key;
  } finally {
    await pool.end();
  }
}

// biome-ignore lint/suspicious/noExplicitAny: JSON from our own API
type Api = (method: string, path: string, body?: unknown) => Promise<{ status: number; json: any }>;

function apiOf(base: string, key: string): Api {
  return async (method, path, body) => {
    const res = await fetch(`${base}/v1${path}`, {
      method,
      headers: { authorization: `Bearer ${key}`, ...(body ? { "content-type": "application/json" } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
    const text = await res.text();
    return { status: res.status, json: text ? JSON.parse(text) : null };
  };
}

/**
 * The example environment's vault (idempotent): a block default (catch-all routing), the package
 * index allowed, a judge behind an ordinary rule whose secret the tasks read as a placeholder from
 * their environment, and the dataset host allowed read-only (GET and HEAD).
 */
async function exampleVault(api: Api, demoKey: string): Promise<void> {
  await api("PUT", "/vault/settings", { default: "block" });
  await api("POST", "/vault/hosts", { pattern: INDEX_HOST, action: "allow" });
  const secrets = (await api("GET", "/vault/secrets")).json.secrets as { id: string; name: string }[];
  const judge = secrets.find((s) => s.name === "JUDGE_API_KEY");
  if (judge) await api("PUT", `/vault/secrets/${judge.id}`, { value: demoKey });
  else await api("POST", "/vault/secrets", { name: "JUDGE_API_KEY", value: demoKey });
  const rules = (await api("GET", "/vault/rules")).json.rules as { host: string }[];
  if (!rules.some((r) => r.host === "judge.demo.test")) {
    const made = await api("POST", "/vault/rules", {
      host: "judge.demo.test",
      secret: "JUDGE_API_KEY",
      inject: { scheme: "bearer" },
    });
    if (made.status >= 300) throw new Error(`judge rule: ${JSON.stringify(made.json)}`);
  }
  const hosts = (await api("GET", "/vault/hosts")).json.hosts as { pattern: string }[];
  if (!hosts.some((h) => h.pattern === "data.demo.test")) {
    const made = await api("POST", "/vault/hosts", {
      pattern: "data.demo.test",
      action: "allow",
      methods: ["GET", "HEAD"],
    });
    if (made.status >= 300) throw new Error(`read-only host: ${JSON.stringify(made.json)}`);
  }
}

/** The vault's demo secret, replaced each start, and its rule for api.demo.test (idempotent). */
async function demoSecretAndRule(api: Api, demoKey: string): Promise<void> {
  const secrets = (await api("GET", "/vault/secrets")).json.secrets as { id: string; name: string }[];
  const existing = secrets.find((s) => s.name === "DEMO_API_KEY");
  if (existing) await api("PUT", `/vault/secrets/${existing.id}`, { value: demoKey });
  else await api("POST", "/vault/secrets", { name: "DEMO_API_KEY", value: demoKey });
  const rules = (await api("GET", "/vault/rules")).json.rules as { host: string }[];
  if (!rules.some((r) => r.host === "api.demo.test")) {
    await api("POST", "/vault/rules", {
      host: "api.demo.test",
      secret: "DEMO_API_KEY",
      inject: { scheme: "bearer" },
    });
  }
}

// biome-ignore lint/suspicious/noExplicitAny: JSON
async function waitForEnd(api: Api, id: string, timeoutMs: number): Promise<any> {
  const started = Date.now();
  for (;;) {
    const run = (await api("GET", `/runs/${id}`)).json;
    if (isTerminal(run.status)) return run;
    if (Date.now() - started > timeoutMs) throw new Error(`run ${id} did not end: ${run.status}`);
    await new Promise((r) => setTimeout(r, 300));
  }
}

/**
 * examples/qa-bench, as `benchwright runs launch --from` sends it: the folder packed and uploaded
 * as a bundle, its setup.sh pip-installing from the demo upstream's package index (allowed in the
 * vault; catch-all routing), three tasks calling api.demo.test without a key, their results
 * collected as artifacts. Prints what happened.
 */
async function example(base: string, key: string, demoKey: string, upstream: DemoUpstream) {
  const api = apiOf(base, key);
  await demoSecretAndRule(api, demoKey);
  await exampleVault(api, demoKey);
  const folder = join(import.meta.dirname, "..", "examples", "qa-bench");
  const spec = JSON.parse(readFileSync(join(folder, "benchwright.json"), "utf8"));
  const { files, ...runSpec } = spec;
  const packed = await packFolder(folder, { files, always: ["benchwright.json"] });
  console.log(`Example: examples/qa-bench (${packed.paths.length} files) as a bundle; setup installs a`);
  console.log("         package from the demo index through the proxy, once: it is kept as a setup");
  console.log("         image and the three tasks start from it ...");
  const started = Date.now();
  const uploaded = await fetch(`${base}/v1/bundles`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/gzip" },
    body: packed.archive,
  });
  if (uploaded.status >= 300) throw new Error(`bundle upload failed: ${await uploaded.text()}`);
  const launched = await api("POST", "/runs", { ...runSpec, bundle: packed.sha256 });
  if (launched.status !== 202) throw new Error(`launch failed: ${JSON.stringify(launched.json)}`);
  const id = launched.json.id as string;
  const run = await waitForEnd(api, id, 300_000);
  const listed = (await api("GET", `/runs/${id}/artifacts`)).json as {
    artifacts: { id: string; sandboxName: string; path: string }[];
    cut: unknown[];
  };
  const results = await Promise.all(
    listed.artifacts.map(async (a) => {
      const res = await fetch(`${base}/v1/runs/${id}/artifacts/${a.id}`, {
        headers: { authorization: `Bearer ${key}` },
      });
      const text = await res.text();
      try {
        return { name: a.sandboxName, text, json: JSON.parse(text) };
      } catch {
        return { name: a.sandboxName, text, json: null };
      }
    }),
  );
  const wheels = upstream.seen.filter(
    (s) => s.host === INDEX_HOST && String(s.path).startsWith("/files/"),
  ).length;
  const keyed = upstream.seen.filter((s) => s.host === "api.demo.test" && s.keyMatches === true).length;
  const judged = upstream.seen.filter((s) => s.host === "judge.demo.test" && s.keyMatches === true).length;
  const uploads = upstream.seen.filter(
    (s) => s.host === "data.demo.test" && String(s.path).includes("/results/"),
  );
  const check = (ok: boolean) => (ok ? "yes" : "NO");
  const each = (f: (r: (typeof results)[number]) => boolean) => results.length === 3 && results.every(f);
  const setup = setupStory(run, wheels, runSpec.tasks.length);
  console.log(`
Example run ${id}: ${run.status} (${run.reason}) in ${((Date.now() - started) / 1000).toFixed(1)} s, routing ${run.routing}
${setup.map(([text, ok, counted]) => `  ${text} ${".".repeat(Math.max(2, 65 - text.length))} ${check(ok)} (${counted})`).join("\n")}
  three tasks wrote their results; collected as artifacts .......... ${check(each((r) => r.json?.package?.name === "benchscore"))} (${results.map((r) => r.name).join(", ") || "none"})
  each task's API call got the vault's key, the task never held it .. ${check(keyed >= 3 && each((r) => r.json?.api?.status === 200 && !r.text.includes(demoKey)))}
  each judge call sent JUDGE_API_KEY from the task's environment (a
    placeholder); the judge's host got the vault's key ................ ${check(judged >= 3 && each((r) => r.json?.judge?.status === 200 && r.json?.judge?.keyInEnvironment === "placeholder"))}
  the read-only data.demo.test: each task read it, and its upload (POST)
    was refused by the proxy and never reached the host .............. ${check(uploads.length === 0 && each((r) => r.json?.dataset?.read === 200 && r.json?.dataset?.write === 403))} (${results[0]?.json?.dataset?.writeAnswer ?? "?"})

Look at it:
  curl -s -H @.data/dev-auth-header-${EXAMPLE_ENVIRONMENT} ${base}/v1/runs/${id}/artifacts
  curl -s -H @.data/dev-auth-header-${EXAMPLE_ENVIRONMENT} ${base}/v1/setup-images
or in a browser: ${base}/runs/${id} (its Stages say which sandbox started from the setup image)
or with the CLI: npx --no benchwright runs artifacts ${id} --out results/
`);
}

// biome-ignore lint/suspicious/noExplicitAny: trace rows are JSON
type TraceRow = { kind: string; detail: any };

/**
 * What the example's setup did, from the run's trace and the index's downloads, as summary lines
 * ([text, whether it holds, what it counted]). The first run in an environment: setup ran once (in
 * the sandbox that built the setup image), one wheel download, and every other sandbox started
 * from that image. A later `npm start` on the same .data: setup ran nowhere, no download, and
 * every sandbox started from the image the earlier run built.
 */
function setupStory(
  run: { id: string; trace: TraceRow[] },
  wheels: number,
  tasks: number,
): [string, boolean, string][] {
  const rows = run.trace.filter(
    (e) => e.kind === "note" && e.detail?.stage === "setup_image" && typeof e.detail.digest === "string",
  );
  const built = rows.filter((e) => typeof e.detail.bytes === "number").map((e) => e.detail);
  const used = rows.filter((e) => typeof e.detail.bytes !== "number").map((e) => e.detail);
  const ranIn = [
    ...new Set(
      run.trace.filter((e) => e.kind === "output" && e.detail?.stage === "setup").map((e) => e.detail.name),
    ),
  ];
  const digests = new Set([...built, ...used].map((d) => d.digest as string));
  const short = `${[...digests][0]?.slice(0, 19) ?? "no image"}…`;
  const downloads = `${wheels} wheel download${wheels === 1 ? "" : "s"}`;
  // One image, and every work and task sandbox either built it or started from it.
  const oneImage = digests.size === 1 && used.length + built.length === tasks + 1;
  const builder = built[0]?.name as string | undefined;
  if (built.length === 1 && builder) {
    const others = builder === "work" ? `the ${used.length} tasks` : `the ${used.length} other sandboxes`;
    return [
      [
        `setup ran once, in ${builder}, and was kept as a setup image`,
        ranIn.length === 1 && ranIn[0] === builder && wheels === 1,
        downloads,
      ],
      [`${others} started from it, with no setup stage`, oneImage && used.every((d) => d.builtNow), short],
    ];
  }
  const by = [...new Set(used.map((d) => d.builtByRunId as string | null))];
  return [
    [
      `setup ran ${ranIn.length === 0 ? "in no sandbox" : `in ${ranIn.join(", ")}`} this time`,
      ranIn.length === 0 && wheels === 0,
      downloads,
    ],
    [
      `work and the ${tasks} tasks started from an earlier run's setup image`,
      oneImage && by.length === 1 && by[0] !== run.id,
      `${short}, built by ${by.length === 1 && by[0] ? by[0] : "?"}`,
    ],
  ];
}

/** Sets up the dev user's vault for the demo (idempotent), runs the demo, prints what happened. */
async function demo(base: string, key: string, demoKey: string, upstream: DemoUpstream) {
  const api = apiOf(base, key);
  await demoSecretAndRule(api, demoKey);
  await api("POST", "/vault/hosts", { pattern: "blocked.demo.test", action: "block" });

  console.log("Demo: launching a run of the `demo` benchmark (it calls api.demo.test without a key,");
  console.log("      then tries blocked.demo.test) ...");
  const started = Date.now();
  const launched = await api("POST", "/runs", { benchmark: "demo" });
  if (launched.status !== 202) throw new Error(`launch failed: ${JSON.stringify(launched.json)}`);
  const id = launched.json.id as string;
  const run = await waitForEnd(api, id, 120_000);
  const output = (run.trace as { kind: string; detail: { stream?: string; text?: string } | null }[])
    .filter((e) => e.kind === "output" && e.detail?.stream === "stdout")
    .map((e) => e.detail?.text ?? "")
    .join("");
  const line = output.split("\n").find((l) => l.startsWith('{"demo"'));
  const result = line ? JSON.parse(line) : null;
  const blocked = (await api("GET", `/runs/${id}/blocked-hosts`)).json.blockedHosts as {
    host: string;
    seenCount: number;
  }[];
  const sawKey = upstream.seen.some((s) => s.host === "api.demo.test" && s.keyMatches === true);
  const upstreamSawBlocked = upstream.seen.some((s) => s.host === "blocked.demo.test");
  const check = (ok: boolean) => (ok ? "yes" : "NO");
  console.log(`
Demo run ${id}: ${run.status} (${run.reason}) in ${((Date.now() - started) / 1000).toFixed(1)} s, routing ${run.routing}
  the sandbox sent no key; the demo API saw the vault's key ...... ${check(sawKey && result?.api?.body?.keyMatches === true)}
  the key never reached the sandbox (output, environment) ........ ${check(!output.includes(demoKey) && noSecretInDemoEnv(result))}
  blocked.demo.test refused (HTTP ${result?.blocked?.status ?? "?"}) and never reached .......... ${check(result?.blocked?.status === 403 && !upstreamSawBlocked)}
  ... and recorded: ${blocked.map((b) => `${b.host} ×${b.seenCount}`).join(", ") || "(not yet)"}

Look at it:
  curl -s -H @.data/dev-auth-header ${base}/v1/runs/${id}
  curl -s -H @.data/dev-auth-header ${base}/v1/runs/${id}/blocked-hosts
  curl -s -H @.data/dev-auth-header ${base}/v1/runs/${id}/egress-routes
or in a browser: ${base}/runs/${id} (log in with the API key in .data/dev-api-key)
or with the CLI: npx --no benchwright login --url ${base} < .data/dev-api-key && npx --no benchwright demo
`);
}

main().catch((e) => {
  console.error(e instanceof Error ? e.message : e);
  process.exit(1);
});
