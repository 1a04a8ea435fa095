import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { curl, type RunningProxy, startPlainUpstream, startProxy, type Upstream, vault } from "./harness";

// Case I6: the explicit proxy port forwards plain-http absolute-form requests to port 80 only.
// The harness's test route sends plain.test to a real plain-HTTP upstream whatever port the URL
// names, so a request let through to another port would reach it: each refusal asserts it did not.

let upstream: Upstream;
let proxy: RunningProxy;

beforeAll(async () => {
  upstream = await startPlainUpstream({ address: "127.0.0.2" });
  proxy = await startProxy({ vault: vault({ default: "allow" }), routes: { "plain.test": upstream } });
});

afterAll(async () => {
  await proxy.close();
  await upstream.close();
});

const viaExplicit = (url: string) => curl(["--proxy", `http://127.0.0.1:${proxy.explicitPort}`, url]);

describe("case I6: plain http through the explicit proxy port", () => {
  it("forwards an absolute-form request to port 80, named or not", async () => {
    for (const url of ["http://plain.test/a", "http://plain.test:80/b"]) {
      const res = await viaExplicit(url);
      expect(res.status, url).toBe(200);
    }
    expect(upstream.seen.map((s) => s.url)).toEqual(["/a", "/b"]);
  });

  it.each([8080, 443, 22, 25, 6379])(
    "case I6: refuses port %i with a readable 403, recorded",
    async (port) => {
      const before = upstream.counts.connections;
      const routes = proxy.audit.routes.length;
      const res = await viaExplicit(`http://plain.test:${port}/x`);
      expect(res.status).toBe(403);
      expect(res.body).toContain(`http://plain.test:${port}/ is not reachable from this run`);
      expect(res.body).toContain("port 80 only");
      expect(upstream.counts.connections).toBe(before);
      expect(proxy.dials.filter((d) => d.port === port)).toEqual([]);
      expect(proxy.audit.routes.slice(routes)).toEqual([["plain.test", "refused"]]);
      expect(proxy.logs.findLast((r) => r.event === "decision")).toMatchObject({
        listener: "explicit",
        host: "plain.test",
        port,
        decision: "refuse",
        reason: `plain http to port ${port}`,
        status: 403,
      });
    },
  );
});
