import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TERMINAL_STATES } from "@benchwright/shared/contract/run-states";
import { afterAll, beforeAll, describe, inject } from "vitest";
import { type ApiClient, apiClient } from "../../scripts/lib/api-client";
import { type DemoUpstream, startDemoUpstream } from "../../scripts/lib/demo-upstream";
import { type LocalStack, startLocalStack } from "../../scripts/lib/local-stack";
import { configureNeonForNode, nodeDb } from "../../scripts/lib/neon-node";
import type { StaticRoute } from "../../scripts/lib/pip-index";
import { provisionApiKey } from "../../src/auth/provision";
import { randomId } from "../../src/crypto/api-keys";
import { REPORTING_GET } from "../../src/runs/demo-script";
import { whyNotRunnable } from "../local/harness";

// One harness for whole runs on the local backend: a demo upstream in a namespace of its own,
// the local stack (host agent + `wrangler dev`) on the suite's database, tenants made through
// the same provisioning code as `npm create-user`, and a client of the public API.

export const SKIP_REASON = whyNotRunnable();
export const HOSTS = [
  "api.demo.test",
  "blocked.demo.test",
  "other.demo.test",
  // examples/qa-bench's judge (an ordinary rule) and read-only dataset host.
  "judge.demo.test",
  "data.demo.test",
];

export interface E2e {
  stack: LocalStack;
  upstream: DemoUpstream;
  canary: string;
  /** Where the stack's agent keeps setup layers (the canary walk reads it). */
  layersDir: string;
  /** Every line the stack logged (the Worker's and the agent's), for waiting on one. */
  logs: string[];
  stop: () => Promise<void>;
}

export interface E2eOptions {
  name: string;
  index: number;
  nft?: string;
  /** Extra proxy settings (fault injection: a setting the proxy refuses to start with). */
  proxyEnv?: Record<string, string>;
  workerVars?: Record<string, string>;
  /** The Worker's own bridge to the database (fault injection); default: the suite's. */
  wsProxy?: string;
  /** More test CAs the proxy trusts upstream (another upstream of the suite's own). */
  extraCaPem?: string;
  /** The vault's canary, when another upstream of the suite must expect it too. */
  canary?: string;
  /** Files the upstream serves as they are (a pip index), on hosts of their own it also serves. */
  static?: StaticRoute[];
}

export async function startE2e(options: E2eOptions): Promise<E2e> {
  const databaseUrl = inject("databaseUrl");
  configureNeonForNode(inject("databaseWsProxy"));
  // The vault's secret: a canary nothing but the upstream (through the proxy) may ever see.
  const canary = options.canary ?? `canary-${randomId("e2e_")}`;
  const upstream = await startDemoUpstream({
    name: options.name,
    index: options.index,
    hosts: HOSTS,
    expectedKey: canary,
    static: options.static,
  });
  const dir = mkdtempSync(join(tmpdir(), "bw-e2e-"));
  const logs: string[] = [];
  const layersDir = join(dir, "setup-layers");
  let stack: LocalStack;
  try {
    stack = await startLocalStack({
      databaseUrl,
      wsProxy: options.wsProxy ?? inject("databaseWsProxy"),
      vaultKek: inject("vaultKek"),
      dir,
      nft: options.nft,
      agentStateDir: join(dir, "agent"),
      agentLayersDir: layersDir,
      proxyTestEnv: {
        ...proxyTestEnv(upstream),
        ...(options.extraCaPem
          ? { BW_TEST_EXTRA_CA_PEM: `${upstream.caPem.trimEnd()}\n${options.extraCaPem}` }
          : {}),
        ...options.proxyEnv,
      },
      workerVars: options.workerVars,
      log: (line) => {
        logs.push(line);
        if (process.env.BW_E2E_LOG) console.log(line);
      },
    });
  } catch (error) {
    await upstream.stop();
    throw error;
  }
  return {
    stack,
    upstream,
    canary,
    layersDir,
    logs,
    stop: async () => {
      await stack.stop();
      await upstream.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export interface E2eBlock {
  /** The stack's options, or a function that first makes what they need (in the same hook). */
  start: E2eOptions | (() => Promise<E2eOptions>);
  /** Undoes what `start` made, once the stack has stopped. */
  after?: () => unknown;
  /** A reason beside SKIP_REASON to skip the block (a missing browser). */
  skip?: string | null;
  /** The start hook's own timeout, where it builds more than the stack. */
  timeout?: number;
}

/**
 * A describe block around one stack: skipped where this machine cannot run whole runs
 * (SKIP_REASON), the stack started before its tests and stopped after them. `body` gets the stack
 * as one object, filled in once it has started; its own afterAll hooks run before the stack stops.
 */
export function describeE2e(title: string, block: E2eBlock, body: (e: E2e) => void): void {
  describe.skipIf(SKIP_REASON !== null || (block.skip ?? null) !== null)(title, () => {
    const e = {} as E2e;
    beforeAll(async () => {
      const options = typeof block.start === "function" ? await block.start() : block.start;
      Object.assign(e, await startE2e(options));
    }, block.timeout);
    afterAll(async () => {
      await e.stop?.();
      await block.after?.();
    });
    body(e);
  });
}

/** Test-only proxy settings: trust the upstream's test CA, route the demo hosts (and its others) to it. */
export function proxyTestEnv(upstream: DemoUpstream): Record<string, string> {
  return {
    BW_TEST_EXTRA_CA_PEM: upstream.caPem,
    BW_TEST_ROUTES: upstream.hosts.map((h) => `${h}=${upstream.address}:${upstream.httpsPort}`).join(","),
    BW_TEST_ALLOW_CIDRS: upstream.cidr,
    // A spliced connection shows the upstream's own certificate, and the work sandboxes trust the
    // run CA and the system roots, not this test CA: terminate every host until they do.
    BW_SPLICE: "off",
  };
}

export type Api = ApiClient;

export async function newUser(apiUrl: string): Promise<Api> {
  const { db, pool } = nodeDb(inject("databaseUrl"));
  const made = await provisionApiKey(db, { email: `${randomId("e2e_")}@tenants.test` });
  await pool.end();
  return apiClient(apiUrl, made.key);
}

const TERMINAL: ReadonlySet<string> = new Set(TERMINAL_STATES);

/** Polls the run until it has ended (the coordinator's alarms drive it; we only look). */
export async function waitForEnd(api: Api, runId: string, timeoutMs = 90_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const run = await api.call("GET", `/v1/runs/${runId}`);
    if (TERMINAL.has(run.json?.status)) return run.json;
    if (Date.now() > deadline) throw new Error(`run ${runId} did not end: ${run.text.slice(0, 2000)}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

// biome-ignore lint/suspicious/noExplicitAny: trace rows are JSON
export type TraceEvent = { kind: string; state: string | null; reason: string | null; detail: any };

/** Everything the run's commands printed on stdout, per sandbox name, in order. */
export function stdoutOf(run: { trace: TraceEvent[] }, name = "work"): string {
  return run.trace
    .filter((e) => e.kind === "output" && e.detail?.stream === "stdout" && e.detail?.name === name)
    .map((e) => e.detail.text as string)
    .join("");
}

/** The last JSON line a sandbox printed. */
// biome-ignore lint/suspicious/noExplicitAny: JSON
export function lastJson(run: { trace: TraceEvent[] }, name = "work"): any {
  const lines = stdoutOf(run, name)
    .split("\n")
    .filter((l) => l.startsWith("{"));
  const last = lines.at(-1);
  if (!last)
    throw new Error(`${name} printed no JSON line; trace: ${JSON.stringify(run.trace).slice(0, 3000)}`);
  return JSON.parse(last);
}

/** A vault: the canary as DEMO_KEY injected for the API host, and a blocked host. */
export async function demoVault(api: Api, canary: string, extra: { default?: "allow" | "block" } = {}) {
  const ok = (res: { status: number; text: string }, what: string) => {
    if (res.status >= 300) throw new Error(`${what}: ${res.status} ${res.text}`);
  };
  ok(await api.call("POST", "/v1/vault/secrets", { name: "DEMO_KEY", value: canary }), "secret");
  ok(
    await api.call("POST", "/v1/vault/rules", {
      host: "api.demo.test",
      secret: "DEMO_KEY",
      inject: { scheme: "bearer" },
    }),
    "rule",
  );
  ok(await api.call("POST", "/v1/vault/hosts", { pattern: "blocked.demo.test", action: "block" }), "block");
  if (extra.default) ok(await api.call("PUT", "/v1/vault/settings", { default: extra.default }), "default");
}

/** A shell command that runs `code` with node, fed on stdin (no quoting to get wrong). */
export const nodeScript = (code: string) => `node - <<'BW_SCRIPT'\n${code}\nBW_SCRIPT`;

/** Client helpers the scripts share: the demo's fetch that reports errors, and a raw TCP connect. */
export const CLIENT_HELPERS = `
const net = require("node:net");${REPORTING_GET}const tcp = (host, port) =>
  new Promise((resolve) => {
    const s = net.connect({ host, port, timeout: 2000 });
    s.on("connect", () => { s.destroy(); resolve("connected"); });
    s.on("error", (e) => resolve(e.code));
    s.on("timeout", () => { s.destroy(); resolve("timeout"); });
  });
`;
