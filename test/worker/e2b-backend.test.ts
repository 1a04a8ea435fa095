import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { describe, expect, inject, it } from "vitest";
import { BackendError, type ComputeBackend } from "../../src/broker/backend";
import { e2bFromEnv } from "../../src/broker/e2b/backend";
import { SANDBOX_TTL_MS } from "../../src/broker/e2b/config";
import { brokerStub, SandboxBroker, sweepBrokerStub } from "../../src/broker/sandbox-broker";
import type { ExecInfo, ExecRequest } from "../../src/contract/local-agent";
import type { RoutingMode } from "../../src/contract/policy";
import { PROXY_ENV } from "../../src/coordinator/machine";
import { randomId } from "../../src/crypto/api-keys";
import { runs, sandboxes } from "../../src/db/schema";
import type { ContractSandbox, E2bFaults, RecordedE2bRequest } from "../contract/e2b-contract";
import { proxyOf } from "./backend-fixtures";
import { newTenant, withDb } from "./harness";
import { findNeedles, leakNeedles, newCanary } from "./leaks";
import { newRun } from "./run-fixtures";

// The e2b backend, inside workerd, with the real `e2b` SDK talking to the E2B CONTRACT SERVER
// (test/contract/e2b-server.ts: E2B's platform API and envd's process API as the SDK calls them,
// written from E2B's OpenAPI spec and process.proto, on loopback). Execs run the real exec runner
// there (real processes); the templates' other programs are stand-ins (see the server's header).
// Each test makes runs of its own, so the requests it asserts are exactly its own.

const e2b = inject("e2b");
const PUBLIC_URL = "https://boundary.contract.test";
const OTHER_DEPLOYMENT = "https://other-deployment.contract.test";
const ENV = {
  E2B_API_KEY: e2b.apiKey,
  PUBLIC_URL,
  E2B_PROXY_TEMPLATE: e2b.templates.proxy,
  E2B_WORK_TEMPLATE: e2b.templates.work,
  E2B_API_URL: e2b.url,
  E2B_DOMAIN: e2b.domain,
  E2B_SANDBOX_URL: e2b.url,
};
const META = { deployment: "bw-deployment", run: "bw-run", kind: "bw-kind", sandbox: "bw-sandbox" };
const SLOW = { timeout: 60_000 };

function backend(over: Record<string, string> = {}): ComputeBackend {
  const made = e2bFromEnv({ ...ENV, ...over });
  if (typeof made === "string") throw new Error(made);
  return made;
}

/** The requests of this file's deployments (test/worker/e2b-stages.test.ts may run meanwhile). */
async function requests(since = 0): Promise<RecordedE2bRequest[]> {
  const all = (await (
    await fetch(`${e2b.url}/_contract/requests?since=${since}`)
  ).json()) as RecordedE2bRequest[];
  const ours = new Set([PUBLIC_URL, OTHER_DEPLOYMENT]);
  return all.filter((r) => r.deployment === null || ours.has(r.deployment));
}
const mark = async () => (await requests()).at(-1)?.seq ?? 0;

async function contractSandboxes(runId: string): Promise<ContractSandbox[]> {
  const all = (await (await fetch(`${e2b.url}/_contract/sandboxes`)).json()) as ContractSandbox[];
  return all.filter((s) => s.metadata[META.run] === runId);
}

async function faults(f: E2bFaults): Promise<void> {
  const res = await fetch(`${e2b.url}/_contract/faults`, { method: "POST", body: JSON.stringify(f) });
  expect(res.status).toBe(204);
}

async function expectBackendError(p: Promise<unknown>, code: string): Promise<BackendError> {
  const error = await p.then(
    () => null,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(BackendError);
  expect((error as BackendError).code).toBe(code);
  return error as BackendError;
}

// biome-ignore lint/suspicious/noExplicitAny: recorded bodies are read field by field
type Body = any;
const body = (r: RecordedE2bRequest | undefined): Body => r?.body;
/** The command line of an envd Start (what followed `bash -l -c`). */
const commandOf = (r: RecordedE2bRequest) => (body(r)?.process?.args?.[2] as string | undefined) ?? "";
const starts = (rs: RecordedE2bRequest[], e2bId: string) =>
  rs.filter((r) => r.api === "envd" && r.path === "/process.Process/Start" && r.sandboxId === e2bId);
const creates = (rs: RecordedE2bRequest[]) =>
  rs.filter((r) => r.method === "POST" && r.path === "/v2/sandboxes");

async function waitExit(b: ComputeBackend, sandboxId: string, execId: string, from = 0): Promise<ExecInfo> {
  for (let i = 0; i < 20; i++) {
    const info = await b.poll(sandboxId, execId, { waitMs: 2_000, stdoutFrom: from });
    if (info.state === "exited") return info;
  }
  throw new Error(`exec ${execId} did not exit`);
}

async function workOf(
  b: ComputeBackend,
  runId: string,
  proxyId: string,
  routing: RoutingMode,
  kind: "work" | "task" = "work",
) {
  const id = randomId("sbx_");
  const info = await b.create({
    kind,
    id,
    runId,
    proxySandboxId: proxyId,
    routing,
    hostsFile: ["api.openai.com"],
  });
  return { id, info };
}

describe("e2b configuration", () => {
  it("names each missing setting and never echoes the API key", () => {
    const none = e2bFromEnv({
      PUBLIC_URL: "",
      E2B_PROXY_TEMPLATE: "",
      E2B_WORK_TEMPLATE: "",
      E2B_API_URL: "",
      E2B_DOMAIN: "",
    });
    expect(none).toBe(
      "E2B_API_KEY is not set; PUBLIC_URL is not an https URL; E2B_PROXY_TEMPLATE is not set; E2B_WORK_TEMPLATE is not set",
    );
    const key = `e2b_${"k".repeat(40)}`;
    const plain = e2bFromEnv({ ...ENV, E2B_API_KEY: key, PUBLIC_URL: "http://boundary.test" });
    expect(plain).toBe("PUBLIC_URL is not an https URL");
    expect(e2bFromEnv({ ...ENV, E2B_API_KEY: "short" })).toBe("E2B_API_KEY is too short");
    expect(typeof backend()).toBe("object");
  });
});

describe("e2b backend: what E2B is asked", SLOW, () => {
  it("proxy sandbox: the exact create request, the bridge started as a process of its own", async () => {
    const b = backend();
    const runId = randomId("run_");
    const since = await mark();
    const proxyId = randomId("sbx_");
    const info = await b.create({ kind: "proxy", id: proxyId, runId });
    const rs = await requests(since);
    const made = creates(rs);
    expect(made).toHaveLength(1);
    expect(body(made[0])).toEqual({
      templateID: e2b.templates.proxy,
      metadata: {
        [META.deployment]: PUBLIC_URL,
        [META.run]: runId,
        [META.kind]: "proxy",
        [META.sandbox]: proxyId,
      },
      network: { allowPublicTraffic: false },
      timeout: SANDBOX_TTL_MS / 1000,
      autoPause: true,
    });
    expect(made[0]?.apiKey).toBe("ok");
    expect(info).toMatchObject({
      id: proxyId,
      runId,
      kind: "proxy",
      state: "ready",
      controlPlaneUrl: PUBLIC_URL,
      proxyAddress: null,
      routing: null,
    });
    const [box] = await contractSandboxes(runId);
    expect(info.address).toBe(box?.sandboxID);
    expect(box?.envVars).toEqual({});
    // The bridge's proxy end, under the runner, as the unprivileged user, its token as its env.
    const [bridge, ...more] = starts(rs, info.address);
    expect(commandOf(bridge as RecordedE2bRequest)).toBe("bw-exec start bw-bridge - 0 -- bw-bridge serve");
    expect(bridge?.user).toBe("user");
    expect(bridge?.accessToken).toBe("ok");
    expect(Object.keys(body(bridge).process.envs).sort()).toEqual(["BW_BRIDGE_PORT", "BW_BRIDGE_TOKEN"]);
    expect(body(bridge).process.envs.BW_BRIDGE_TOKEN).toMatch(/^[0-9a-f]{64}$/);
    expect(body(bridge).process.envs.BW_BRIDGE_PORT).toBe("8090");
    expect(more.map(commandOf).every((c) => c.startsWith("bw-exec poll bw-bridge "))).toBe(true);
    // envd never sees the API key; the platform API always does, and nothing else sends it.
    expect(rs.filter((r) => r.api === "envd").every((r) => r.apiKey === "absent")).toBe(true);
    await b.destroy(proxyId);
  });

  it("the proxy's credentials go only to the bw-proxy process start, never to sandbox settings", async () => {
    const b = backend();
    const runId = randomId("run_");
    const since = await mark();
    const { proxyId, info, launch, creds } = await proxyOf(b, runId);
    const rs = await requests(since);
    const needles = [...(await leakNeedles(creds.token)), ...(await leakNeedles(creds.audit))];
    const carrying = rs.filter((r) => findNeedles("", JSON.stringify(r), needles).length > 0);
    expect(carrying).toHaveLength(1);
    const start = carrying[0] as RecordedE2bRequest;
    expect(start.sandboxId).toBe(info.address);
    expect(commandOf(start)).toBe("bw-exec start proxy-1 - 0 -- bw-proxy");
    expect(start.user).toBe("user");
    expect(body(start).process.envs).toEqual({
      ...PROXY_ENV,
      BW_RUN_ID: runId,
      BW_PROXY_TOKEN: creds.token,
      BW_AUDIT_KEY: creds.audit,
      // The backend's own: where the control plane is, and listeners on loopback only.
      BW_CONTROL_PLANE_URL: PUBLIC_URL,
      BW_LISTEN_HOST: "127.0.0.1",
    });
    expect(launch).toMatchObject({ execId: "proxy-1", sandboxId: proxyId, state: "running" });
    const [box] = await contractSandboxes(runId);
    expect(JSON.stringify(box)).not.toContain(creds.token);
    // The runner keeps its output: the stand-in's first line is there on the next poll.
    const polled = await b.poll(proxyId, "proxy-1", { waitMs: 2_000 });
    expect(polled.stdout).toContain("bw-proxy stand-in");
    await b.destroy(proxyId);
  });

  it("work sandbox, default routing: exact create, the user check, the bridge to the proxy", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId, info: proxy } = await proxyOf(b, runId);
    const since = await mark();
    const { id, info } = await workOf(b, runId, proxyId, "default");
    const rs = await requests(since);
    const made = creates(rs);
    expect(made).toHaveLength(1);
    expect(body(made[0])).toEqual({
      templateID: e2b.templates.work,
      metadata: {
        [META.deployment]: PUBLIC_URL,
        [META.run]: runId,
        [META.kind]: "work",
        [META.sandbox]: id,
        "bw-proxy": proxyId,
        "bw-routing": "default",
      },
      network: { allowPublicTraffic: false },
      timeout: SANDBOX_TTL_MS / 1000,
      autoPause: true,
    });
    expect(info).toMatchObject({
      id,
      kind: "work",
      routing: "default",
      proxyAddress: "127.0.0.1",
      probeTarget: null,
      wiring: null,
      controlPlaneUrl: null,
    });
    const [drop, check, workdir, bridge] = starts(rs, info.address);
    // Root taken away from the execute user (as root), then checked as that user, before anything.
    expect(commandOf(drop as RecordedE2bRequest)).toBe("bw-drop-root");
    expect(drop?.user).toBe("root");
    expect(commandOf(check as RecordedE2bRequest)).toBe("bw-check-user");
    expect(check?.user).toBe("user");
    // The working directory (/home/sandbox), the execute user's.
    expect(commandOf(workdir as RecordedE2bRequest)).toBe("bw-workdir");
    expect(workdir?.user).toBe("root");
    expect(commandOf(bridge as RecordedE2bRequest)).toBe("bw-exec start bw-bridge - 0 -- bw-bridge connect");
    expect(bridge?.user).toBe("root");
    const proxyStarts = starts(await requests(0), proxy.address);
    const serveToken = body(proxyStarts.find((r) => commandOf(r).endsWith("bw-bridge serve"))).process.envs
      .BW_BRIDGE_TOKEN;
    const envs = body(bridge).process.envs;
    expect(envs).toEqual({
      BW_BRIDGE_URL: `https://8090-${proxy.address}.${e2b.domain}`,
      BW_BRIDGE_TOKEN: serveToken,
      BW_BRIDGE_EDGE_TOKEN: expect.stringMatching(/^ta_[0-9a-f]{32}$/),
      BW_BRIDGE_LISTEN: "127.0.0.1",
    });
    // Default routing installs no redirect: the hosts file (the wiring, as root) does the work.
    expect(starts(rs, info.address).map(commandOf)).not.toContain("bw-redirect");
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("catch-all: E2B's firewall lets out only the proxy's bridge host; the redirect is installed", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId, info: proxy } = await proxyOf(b, runId);
    const since = await mark();
    const { id, info } = await workOf(b, runId, proxyId, "catch-all", "task");
    const rs = await requests(since);
    const host = `8090-${proxy.address}.${e2b.domain}`;
    expect(body(creates(rs)[0]).network).toEqual({
      allowOut: [host],
      denyOut: ["0.0.0.0/0"],
      allowPublicTraffic: false,
    });
    expect(body(creates(rs)[0]).metadata).toMatchObject({ [META.kind]: "task", "bw-routing": "catch-all" });
    // What E2B holds is read back before anything runs in the sandbox.
    const check = rs.findIndex((r) => r.method === "GET" && r.path === `/sandboxes/${info.address}`);
    const firstStart = rs.findIndex((r) => r.api === "envd" && r.sandboxId === info.address);
    expect(check).toBeGreaterThan(-1);
    expect(check).toBeLessThan(firstStart);
    expect(rs.some((r) => r.path === `/sandboxes/${info.address}/network`)).toBe(false); // nothing to repair
    const redirect = starts(rs, info.address).find((r) => commandOf(r) === "bw-redirect");
    expect(redirect?.user).toBe("root");
    expect(info).toMatchObject({ routing: "catch-all", proxyAddress: "127.0.0.1", probeTarget: null });
    const [box] = (await contractSandboxes(runId)).filter((s) => s.sandboxID === info.address);
    expect(box?.network).toMatchObject({ allowOut: [host], denyOut: ["0.0.0.0/0"] });
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("an E2B that drops the network settings gets them whole in one update, or the sandbox is refused", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId, info: proxy } = await proxyOf(b, runId);
    const host = `8090-${proxy.address}.${e2b.domain}`;
    await faults({ runId, dropNetworkOnCreate: true });
    let since = await mark();
    const repaired = await workOf(b, runId, proxyId, "catch-all");
    let puts = (await requests(since)).filter((r) => r.method === "PUT");
    expect(puts).toHaveLength(1);
    expect(puts[0]?.path).toBe(`/sandboxes/${repaired.info.address}/network`);
    // The update replaces the whole egress configuration: both lists, never one alone.
    expect(body(puts[0])).toEqual({ allowOut: [host], denyOut: ["0.0.0.0/0"] });

    await faults({ runId, dropNetworkOnCreate: true, ignoreNetworkUpdates: true });
    since = await mark();
    const err = await expectBackendError(workOf(b, runId, proxyId, "catch-all"), "cannot_isolate");
    expect(err.message).toContain("E2B does not hold the network settings");
    const rs = await requests(since);
    puts = rs.filter((r) => r.method === "PUT");
    expect(puts.map(body)).toEqual([{ allowOut: [host], denyOut: ["0.0.0.0/0"] }]);
    // Nothing ran in it: no envd call reached the sandbox that was refused.
    const refusedId = body(creates(rs)[0]) && puts[0]?.sandboxId;
    expect(rs.filter((r) => r.api === "envd" && r.sandboxId === refusedId)).toEqual([]);
    await b.destroy(repaired.id);
    await b.destroy(proxyId);
  });

  it("a work template whose execute user can become root is refused; a failed redirect stops catch-all", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    await faults({ runId, checkUserFails: true });
    const err = await expectBackendError(workOf(b, runId, proxyId, "default"), "cannot_isolate");
    expect(err.message).toContain("execute user become root");
    await faults({ runId, redirectFails: true });
    const redirect = await expectBackendError(
      workOf(b, runId, proxyId, "catch-all"),
      "redirect_not_installed",
    );
    expect(redirect.message).toContain("iptables");
    await faults({ runId });
    for (const s of await contractSandboxes(runId)) await b.destroy(s.metadata[META.sandbox] as string);
  });

  it("a work sandbox must name its own run's proxy sandbox", async () => {
    const b = backend();
    const [a, other] = [randomId("run_"), randomId("run_")];
    const { proxyId } = await proxyOf(b, other);
    const since = await mark();
    await expectBackendError(workOf(b, a, proxyId, "default"), "not_found");
    await expectBackendError(workOf(b, a, randomId("sbx_"), "default"), "not_found");
    expect(creates(await requests(since))).toEqual([]);
    await b.destroy(proxyId);
  });
});

describe("e2b backend: execs", SLOW, () => {
  it("round trip: stages map to users, stdin arrives whole, exit code and output offsets come back", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const { id, info } = await workOf(b, runId, proxyId, "default");
    const since = await mark();
    const stdin = JSON.stringify({ mode: "default", hostsFile: ["api.openai.com"] });
    const started = await b.exec(id, {
      id: "wiring",
      argv: ["sh", "-c", "cat; printf '\\nerr' >&2; exit 7"],
      env: {},
      stage: "setup",
      stdin,
      timeoutMs: 60_000,
    });
    expect(started).toMatchObject({ execId: "wiring", sandboxId: id });
    const done = await waitExit(b, id, "wiring");
    expect(done).toMatchObject({ state: "exited", exitCode: 7, stdout: stdin, stderr: "\nerr" });
    expect(done.stdoutEnd).toBe(new TextEncoder().encode(stdin).length);
    const rs = await requests(since);
    const [start] = starts(rs, info.address);
    expect(commandOf(start as RecordedE2bRequest)).toBe(
      `bw-exec start wiring 60000 ${stdin.length} --setup -- sh -c 'cat; printf '"'"'\\nerr'"'"' >&2; exit 7'`,
    );
    expect(start?.user).toBe("root");
    expect(body(start).stdin).toBe(true);
    const input = rs.filter((r) => r.path === "/process.Process/SendInput");
    expect(input).toHaveLength(1);
    expect(atob(body(input[0]).input.stdin)).toBe(stdin);

    // An execute-stage command: as `user`, paged by offsets while it runs.
    const cmd: ExecRequest = {
      id: "cmd-0",
      argv: ["sh", "-c", "printf one; sleep 1; printf two"],
      env: { NODE_EXTRA_CA_CERTS: "/run/benchwright/run-ca.pem" },
      stage: "execute",
      timeoutMs: 600_000,
    };
    const mark2 = await mark();
    await b.exec(id, cmd);
    const execStart = starts(await requests(mark2), info.address)[0] as RecordedE2bRequest;
    expect(execStart.user).toBe("user");
    expect(body(execStart).process.envs).toEqual(cmd.env);
    const first = await b.poll(id, "cmd-0", { waitMs: 800 });
    expect(first).toMatchObject({ state: "running", stdout: "one", stdoutEnd: 3 });
    const rest = await waitExit(b, id, "cmd-0", first.stdoutEnd);
    expect(rest).toMatchObject({ exitCode: 0, stdout: "two", stdoutEnd: 6 });
    const polls = starts(await requests(mark2), info.address).filter((r) =>
      commandOf(r).startsWith("bw-exec poll"),
    );
    // An execute command is the execute user's: it is polled as that user, not as root.
    expect(polls.length).toBeGreaterThan(0);
    expect(polls.every((r) => r.user === "user")).toBe(true);
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("exec is idempotent by its id: a replayed start returns the first and runs nothing", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const { id } = await workOf(b, runId, proxyId, "default");
    const count: ExecRequest = {
      id: "cmd-0",
      argv: ["sh", "-c", "echo run >> marks; wc -l < marks"],
      env: {},
      stage: "execute",
      timeoutMs: 60_000,
    };
    await b.exec(id, count);
    expect((await waitExit(b, id, "cmd-0")).stdout.trim()).toBe("1");
    const replay = await b.exec(id, count);
    expect(replay).toMatchObject({ execId: "cmd-0", state: "exited", exitCode: 0 });
    await b.exec(id, { ...count, id: "cmd-1" });
    // Had the replay run, this would count 3.
    expect((await waitExit(b, id, "cmd-1")).stdout.trim()).toBe("2");
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("kill ends a running exec with SIGKILL; an exec or sandbox it does not know is not_found", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const killed = await b.kill(proxyId, "proxy-1");
    expect(killed).toMatchObject({ execId: "proxy-1", state: "exited", signal: "SIGKILL" });
    await expectBackendError(b.kill(proxyId, "proxy-2"), "not_found");
    await expectBackendError(b.poll(proxyId, "nope", {}), "not_found");
    await expectBackendError(
      b.exec(randomId("sbx_"), { argv: ["true"], env: {}, stage: "setup" }),
      "not_found",
    );
    await b.destroy(proxyId);
  });
});

describe("e2b backend: freeze, destroy, list", SLOW, () => {
  it("halting pauses a work sandbox; resuming connects, keeps its exec running, re-checks its network", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId, info: proxy } = await proxyOf(b, runId);
    const { id, info } = await workOf(b, runId, proxyId, "catch-all");
    await b.exec(id, {
      id: "cmd-0",
      argv: ["sh", "-c", "sleep 30"],
      env: {},
      stage: "execute",
      timeoutMs: 600_000,
    });
    let since = await mark();
    await b.freeze(id, true);
    const box = async () => (await contractSandboxes(runId)).find((s) => s.sandboxID === info.address);
    expect(await box()).toMatchObject({ state: "paused", pauses: 1 });
    expect((await requests(since)).map((r) => `${r.method} ${r.path}`)).toEqual([
      `POST /sandboxes/${info.address}/pause`,
    ]);
    since = await mark();
    await b.freeze(id, false);
    expect(await box()).toMatchObject({ state: "running", resumes: 1 });
    const resumed = await requests(since);
    expect(resumed.some((r) => r.path === `/v2/sandboxes/${info.address}/connect` && r.status === 201)).toBe(
      true,
    );
    expect(resumed.some((r) => r.method === "GET" && r.path === `/sandboxes/${info.address}`)).toBe(true);
    expect((await b.poll(id, "cmd-0", {})).state).toBe("running");

    // Back without its network settings: they are put back whole before anything runs.
    await faults({ runId, dropNetworkOnResume: true });
    await b.freeze(id, true);
    since = await mark();
    await b.freeze(id, false);
    const put = (await requests(since)).filter((r) => r.method === "PUT");
    expect(put.map(body)).toEqual([
      { allowOut: [`8090-${proxy.address}.${e2b.domain}`], denyOut: ["0.0.0.0/0"] },
    ]);

    // ...and if E2B will not take them, the sandbox is paused again and the resume fails.
    await faults({ runId, dropNetworkOnResume: true, ignoreNetworkUpdates: true });
    await b.freeze(id, true);
    await expectBackendError(b.freeze(id, false), "cannot_isolate");
    expect(await box()).toMatchObject({ state: "paused" });
    await faults({ runId });
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("a lingering proxy is paused and resumed with E2B's pause and connect", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId, info } = await proxyOf(b, runId);
    const since = await mark();
    await b.freeze(proxyId, true);
    await b.freeze(proxyId, true); // already paused: no error
    await b.freeze(proxyId, false);
    const rs = (await requests(since)).map((r) => `${r.method} ${r.path} ${r.status}`);
    expect(rs).toEqual([
      `POST /sandboxes/${info.address}/pause 204`,
      `POST /sandboxes/${info.address}/pause 409`,
      `POST /v2/sandboxes/${info.address}/connect 201`,
    ]);
    // The proxy process survived the pause: the runner still has it running.
    expect((await b.poll(proxyId, "proxy-1", {})).state).toBe("running");
    await b.destroy(proxyId);
  });

  it("list maps sandboxes back by metadata, this deployment's only; destroy is kill, twice is fine", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const { id } = await workOf(b, runId, proxyId, "default");
    const other = backend({ PUBLIC_URL: OTHER_DEPLOYMENT });
    const theirs = randomId("sbx_");
    await other.create({ kind: "proxy", id: theirs, runId });
    const listed = await b.list();
    expect(listed).toEqual(
      expect.arrayContaining([
        { id: proxyId, runId, kind: "proxy" },
        { id, runId, kind: "work" },
      ]),
    );
    expect(listed.map((l) => l.id)).not.toContain(theirs);
    // Asked by metadata (keys and values URL-encoded, as E2B's API wants), not filtered here.
    const listCall = (await requests())
      .filter((r) => r.method === "GET" && r.path === "/v2/sandboxes")
      .at(-1);
    const asked = [...new URLSearchParams(listCall?.query.metadata ?? "")].map(([k, v]) => [
      decodeURIComponent(k),
      decodeURIComponent(v),
    ]);
    expect(Object.fromEntries(asked)).toEqual({ [META.deployment]: PUBLIC_URL });

    const since = await mark();
    await b.destroy(id);
    await b.destroy(id);
    const kills = (await requests(since)).filter((r) => r.method === "DELETE");
    expect(kills.map((r) => r.status)).toEqual([204]);
    expect((await b.list()).map((l) => l.id)).not.toContain(id);
    await expectBackendError(b.poll(id, "cmd-0", {}), "not_found");
    await b.destroy(proxyId);
    await other.destroy(theirs);
    expect(await contractSandboxes(runId)).toEqual([]);
  });
});

describe("e2b backend through the sandbox broker", SLOW, () => {
  it("no vault secret, no E2B key, no proxy credential in any work or task sandbox request", async () => {
    const t = await newTenant();
    const canary = newCanary("e2b");
    const put = await t.api("POST", "/v1/vault/secrets", { name: "OPENAI_API_KEY", value: canary });
    expect(put.status).toBe(201);
    const run = await newRun(t);
    await withDb((db) => db.update(runs).set({ backend: "e2b" }).where(eq(runs.id, run.id)));
    const over = { ...env, ...ENV, COMPUTE_BACKEND: "e2b" };
    const since = await mark();
    const [proxyId, workId, taskId] = [randomId("sbx_"), randomId("sbx_"), randomId("sbx_")];
    const made = await runInDurableObject(brokerStub(env, run.id), async (_i, state) => {
      const broker = new SandboxBroker(state, over);
      const proxy = await broker.create(run.id, { id: proxyId, kind: "proxy" });
      await broker.exec(run.id, proxyId, {
        id: "proxy-1",
        argv: ["bw-proxy"],
        env: { ...PROXY_ENV, BW_RUN_ID: run.id, BW_PROXY_TOKEN: run.proxyToken, BW_AUDIT_KEY: run.auditKey },
        stage: "setup",
        timeoutMs: null,
      });
      const work = await broker.create(run.id, {
        id: workId,
        kind: "work",
        taskIndex: null,
        proxySandboxId: proxyId,
        routing: "default",
        hostsFile: ["api.openai.com"],
      });
      const task = await broker.create(run.id, {
        id: taskId,
        kind: "task",
        taskIndex: 0,
        proxySandboxId: proxyId,
        routing: "catch-all",
        hostsFile: [],
      });
      for (const id of [workId, taskId]) {
        await broker.exec(run.id, id, {
          id: "wiring",
          argv: ["bw-wiring"],
          env: {},
          stage: "setup",
          stdin: JSON.stringify({ mode: "default", proxyAddress: "127.0.0.1" }),
          timeoutMs: 60_000,
        });
        await broker.exec(run.id, id, {
          id: "cmd-0",
          argv: ["sh", "-c", "echo hello"],
          env: {},
          stage: "execute",
          timeoutMs: 600_000,
        });
      }
      return { proxy, work, task };
    });
    expect(made.proxy.ok && made.work.ok && made.task.ok).toBe(true);
    const ids = new Set(
      [made.work, made.task].map((m) => (m.ok ? m.info.address : "")).filter((a) => a !== ""),
    );
    const rs = await requests(since);
    const theirs = rs.filter(
      (r) =>
        (r.sandboxId !== null && ids.has(r.sandboxId)) ||
        (r.path === "/v2/sandboxes" && body(r)?.metadata?.[META.kind] !== "proxy" && r.method === "POST"),
    );
    expect(theirs.length).toBeGreaterThan(8);
    const needles = [
      ...(await leakNeedles(canary)),
      ...(await leakNeedles(e2b.apiKey)),
      ...(await leakNeedles(run.proxyToken)),
      ...(await leakNeedles(run.auditKey)),
    ];
    expect(theirs.flatMap((r) => findNeedles(`${r.method} ${r.path}`, JSON.stringify(r), needles))).toEqual(
      [],
    );
    // The search finds what is there: the proxy token is in the proxy's own launch, once.
    const tokenNeedles = await leakNeedles(run.proxyToken);
    expect(rs.filter((r) => findNeedles("", JSON.stringify(r), tokenNeedles).length > 0)).toHaveLength(1);
    // No sandbox of the run carries settings of its own (envs), nor anything secret in metadata.
    for (const s of await contractSandboxes(run.id)) {
      expect(s.envVars).toEqual({});
      expect(findNeedles(s.sandboxID, JSON.stringify(s), needles)).toEqual([]);
    }

    // Teardown through the broker: every sandbox of the run killed, work and task first.
    const destroyed = await runInDurableObject(brokerStub(env, run.id), (_i, state) =>
      new SandboxBroker(state, over).destroyRun(run.id),
    );
    expect(destroyed).toBe(3);
    expect(await contractSandboxes(run.id)).toEqual([]);
    const rows = await withDb((db) => db.select().from(sandboxes).where(eq(sandboxes.runId, run.id)));
    expect(rows.every((r) => r.status === "destroyed" && r.backend === "e2b")).toBe(true);
  });

  it("the orphan sweep destroys an E2B sandbox no live row owns, and leaves a live one", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    await withDb((db) => db.update(runs).set({ backend: "e2b" }).where(eq(runs.id, run.id)));
    const over = { ...env, ...ENV, COMPUTE_BACKEND: "e2b" };
    const live = randomId("sbx_");
    await runInDurableObject(brokerStub(env, run.id), (_i, state) =>
      new SandboxBroker(state, over).create(run.id, { id: live, kind: "proxy" }),
    );
    const orphan = randomId("sbx_");
    await backend().create({ kind: "proxy", id: orphan, runId: randomId("run_") });
    const swept = await runInDurableObject(sweepBrokerStub(env), (_i, state) =>
      new SandboxBroker(state, over).sweepUnowned(),
    );
    expect(swept).toMatchObject({ destroyed: expect.arrayContaining([orphan]) });
    expect((swept as { destroyed: string[] }).destroyed).not.toContain(live);
    const ids = (await backend().list()).map((l) => l.id);
    expect(ids).toContain(live);
    expect(ids).not.toContain(orphan);
    await backend().destroy(live);
  });
});
