import { describe, expect, it } from "vitest";
import { randomId } from "../../src/crypto/api-keys";
import { expectBackendError, proxyOf } from "./backend-fixtures";
import { body, contractSandboxes, e2b, e2bDeployment, faults, META, SLOW, workOf } from "./e2b-fixtures";

// The e2b backend's sandbox lifecycle, inside workerd, with the real `e2b` SDK against the E2B
// CONTRACT SERVER (test/contract/e2b-server.ts): freeze as E2B's pause and connect (the network
// settings checked again on resume), destroy as kill, list by metadata. Apart from creation
// (e2b-create.test.ts): these are the calls on a sandbox that is already there.
// Each test makes runs of its own, so the requests it asserts are exactly its own.

const PUBLIC_URL = "https://lifecycle.contract.test";
/** A second deployment on the same E2B team, whose sandboxes list must not return. */
const OTHER_DEPLOYMENT = "https://other-deployment.contract.test";
const { backend, requests, mark } = e2bDeployment(PUBLIC_URL, { others: [OTHER_DEPLOYMENT], unowned: true });

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
