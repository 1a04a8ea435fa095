import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { WIRING_PROBE_HOST } from "@benchwright/shared/contract/proxy-wire";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { COMPUTE_PATH_PREFIX, computeLane, computeUrl } from "../../proxy-image/src/proxy/compute-lane";
import { type RunningProxy, startProxy, vault } from "./harness";
import { exchange, wire } from "./raw";

// Case I7: the compute lane forwards https://probe.benchwright.invalid/compute/... to the control
// plane, and a path cannot leave that prefix. A real HTTP server plays the control plane (under a
// base path, as a deployment may mount it) and records every request that reaches it; the sandbox
// side is raw requests over real TLS to the real proxy, so the path arrives byte for byte.

let controlPlane: Server;
let base = "";
const reached: string[] = [];
let proxy: RunningProxy;

beforeAll(async () => {
  controlPlane = createServer((req, res) => {
    reached.push(req.url ?? "");
    const body = JSON.stringify({ route: req.url });
    res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
    res.end(body);
  });
  await new Promise<void>((resolve) => controlPlane.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(controlPlane.address() as AddressInfo).port}/cp`;
  proxy = await startProxy({ vault: vault({ default: "block" }), computeLane: computeLane(base) });
});

afterAll(async () => {
  await proxy.close();
  controlPlane.closeAllConnections();
  await new Promise((resolve) => controlPlane.close(resolve));
});

async function send(path: string) {
  const r = await exchange({ port: proxy.tlsPort, tls: { servername: WIRING_PROBE_HOST, ca: proxy.caPem } }, [
    wire(`GET ${path} HTTP/1.1`, [
      `Host: ${WIRING_PROBE_HOST}`,
      "Authorization: Bearer bwc_test",
      "Connection: close",
    ]),
  ]);
  const response = r.responses[0];
  return { status: response?.status, body: response?.body.toString("utf8") ?? "" };
}

const ESCAPES = [
  "/compute/../v1/me",
  "/compute/envs/../../v1/me",
  "/compute/%2e%2e/v1/me",
  "/compute/%2E%2E/v1/me",
  "/compute/.%2e/v1/me",
  "/compute/%2e./v1/me",
  "/compute/./envs",
  "/compute/envs/.",
  "/compute/envs%2f..%2f..%2fv1%2fme",
  "/compute/envs%2F..%2F..%2Fv1%2Fme",
  "/compute/envs%5c..%5c..%5cv1%5cme",
  "/compute/envs\\..\\..\\v1\\me",
  "/compute/%252e%252e/v1/me",
  "/compute/envs?x=1#frag",
];

describe("case I7: a compute-lane path cannot leave /compute/", () => {
  it("forwards a path under the prefix as written (the control)", async () => {
    const res = await send("/compute/envs/env_1/exec?wait=1");
    expect(res.status).toBe(200);
    expect(reached.at(-1)).toBe("/cp/compute/envs/env_1/exec?wait=1");
  });

  it.each(ESCAPES)(
    "case I7: refuses %s with 400 invalid_path; the control plane sees nothing",
    async (path) => {
      const before = reached.length;
      const res = await send(path);
      expect(res.status).toBe(400);
      expect(JSON.parse(res.body)).toMatchObject({ status: 400, code: "invalid_path" });
      expect(reached.length).toBe(before);
    },
  );

  it("case I7: builds the URL, then checks it is still under the prefix", () => {
    expect(computeUrl("http://cp.test/base", "/compute/envs?x=1")?.href).toBe(
      "http://cp.test/base/compute/envs?x=1",
    );
    for (const path of ESCAPES) expect(computeUrl("http://cp.test/base", path), path).toBeNull();
    // Not the lane's prefix at all, and characters the URL parser would re-encode (normalise).
    for (const path of ["/v1/me", "/computer/x", "/compute", "/compute/a b", '/compute/a"b']) {
      expect(computeUrl("http://cp.test/base", path), path).toBeNull();
    }
    expect(COMPUTE_PATH_PREFIX).toBe("/compute/");
  });
});
