import { describe, expect, it } from "vitest";
import { e2bFromEnv } from "../../src/broker/e2b/backend";
import { SANDBOX_TTL_MS } from "../../src/broker/e2b/config";
import { PROXY_ENV } from "../../src/coordinator/machine";
import { randomId } from "../../src/crypto/api-keys";
import type { RecordedE2bRequest } from "../contract/e2b-contract";
import { expectBackendError, proxyOf } from "./backend-fixtures";
import {
  body,
  commandOf,
  contractSandboxes,
  e2b,
  e2bDeployment,
  faults,
  META,
  SLOW,
  starts,
  workOf,
} from "./e2b-fixtures";
import { findNeedles, leakNeedles } from "./leaks";

// The e2b backend's configuration and what E2B is asked when it makes sandboxes, inside workerd,
// with the real `e2b` SDK talking to the E2B CONTRACT SERVER (test/contract/e2b-server.ts: E2B's
// platform API and envd's process API as the SDK calls them, written from E2B's OpenAPI spec and
// process.proto, on loopback): the exact create requests per kind and routing, where the
// credentials go, the network settings E2B must hold, the templates' checks. The bridge and the
// templates' other programs are stand-ins there (see test/contract/e2b-processes.ts); execs, the
// lifecycle and the broker have files of their own (e2b-execs, e2b-lifecycle, e2b-broker).
// Each test makes runs of its own, so the requests it asserts are exactly its own.

const PUBLIC_URL = "https://create.contract.test";
const { ENV, backend, requests, mark } = e2bDeployment(PUBLIC_URL, { unowned: true });

const creates = (rs: RecordedE2bRequest[]) =>
  rs.filter((r) => r.method === "POST" && r.path === "/v2/sandboxes");

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
