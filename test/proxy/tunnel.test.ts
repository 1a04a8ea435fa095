import { randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { describe, expect, it } from "vitest";
import { TunnelError } from "../../proxy-image/src/proxy/tunnel-client";
import {
  BIG,
  bigWriter,
  newAgent,
  newClient,
  newRelay,
  PROXY_TOKEN,
  policy,
  pool,
  refusalOf,
  tunnel,
  useTunnelWorld,
} from "./tunnel-world";

// The egress tunnel end to end on loopback: the proxy's TunnelClient and an undici Pool over it,
// the real egress agent (in-process, and once as the built CLI), a test double of our relay
// (tunnel-relay.ts), and real TLS upstreams with certificates from the suite's own CA. Names
// resolve through the agent's injected lookup; its injected dial maps ports 443/80 to the
// upstreams' ephemeral ports (the checked address is dialled unchanged).

useTunnelWorld();

describe("egress tunnel: traffic", () => {
  it("carries https with TLS verified end to end, and a self-signed upstream fails", async () => {
    const { agent, proxy } = await tunnel();
    const res = await pool(proxy.client, "https://api.test").request({ path: "/hello", method: "GET" });
    expect(res.statusCode).toBe(200);
    expect(await res.body.text()).toBe("hello from api.test");
    expect(agent.log.records).toContainEqual({ event: "allowed", host: "api.test", port: 443 });

    const bad = await pool(proxy.client, "https://selfsigned.test")
      .request({ path: "/", method: "GET" })
      .then(
        () => null,
        (e: NodeJS.ErrnoException) => e,
      );
    expect(bad).not.toBeNull();
    expect(bad?.code).toMatch(/SELF_SIGNED|UNABLE_TO_VERIFY/);
    expect(bad).not.toBeInstanceOf(TunnelError);
  });

  it("carries plain http", async () => {
    const { proxy } = await tunnel();
    const res = await pool(proxy.client, "http://plain.test").request({ path: "/", method: "GET" });
    expect(res.statusCode).toBe(200);
    expect(await res.body.text()).toBe("plain hello from plain.test");
  });

  it("multiplexes concurrent connections as streams of one session", async () => {
    const { relay, agent, proxy } = await tunnel();
    const p = pool(proxy.client, "https://api.test", 5);
    const answers = await Promise.all(
      Array.from({ length: 5 }, () =>
        p.request({ path: "/barrier?n=5", method: "GET" }).then((r) => r.body.text()),
      ),
    );
    expect(answers).toEqual(Array(5).fill("together"));
    expect(agent.log.records.filter((r) => r.event === "allowed")).toHaveLength(5);
    expect(agent.log.records.filter((r) => r.event === "paired")).toHaveLength(1);
    expect(relay.accepted).toEqual({ proxy: 1, agent: 1 });
  });

  it("applies back-pressure: a reader that stops holds the upstream back instead of buffering", async () => {
    const { proxy } = await tunnel();
    const res = await pool(proxy.client, "https://big.test").request({ path: "/big", method: "GET" });
    const body = res.body[Symbol.asyncIterator]();
    let read = ((await body.next()).value as Buffer).length;
    // The reader stops. The upstream must come to a standstill well short of the whole body:
    // write() said wait and no 'drain' came while it was watched (at most 5 s, then it fails).
    let last = -1;
    let still = 0;
    for (let i = 0; i < 100 && still < 3; i++) {
      still = bigWriter.written === last ? still + 1 : 0;
      last = bigWriter.written;
      await sleep(50);
    }
    const stalledAt = bigWriter.written;
    expect(still).toBe(3);
    expect(bigWriter.waits).toBeGreaterThan(0);
    // What is in flight is the HTTP/2 windows (1 MiB per stream) plus socket buffers on the way.
    expect(stalledAt).toBeLessThan(BIG / 2);
    for (let next = await body.next(); !next.done; next = await body.next())
      read += (next.value as Buffer).length;
    expect(read).toBe(BIG);
  }, 30_000);
});

describe("egress tunnel: refusals", () => {
  it("refuses each kind with the kind the agent named, and logs one line per decision", async () => {
    const { agent, proxy } = await tunnel({ block: ["mine.test", "*.private.test"] });
    const kindOf = async (host: string, port = 443) => (await refusalOf(proxy.client.open(host, port))).kind;
    expect(await kindOf("blocked.test")).toBe("blocked");
    expect(await kindOf("mine.test")).toBe("blocked");
    expect(await kindOf("a.private.test")).toBe("blocked");
    expect(await kindOf("rebind.test")).toBe("address");
    expect(await kindOf("metadata.test")).toBe("address");
    expect(await kindOf("169.254.169.254")).toBe("address");
    expect(await kindOf("nxdomain.test")).toBe("dns");
    expect(await kindOf("api.test", 22)).toBe("bad_target");
    expect(await kindOf("down.test")).toBe("unreachable");

    const refused = agent.log.records.filter((r) => r.event === "refused");
    expect(refused.map((r) => [r.host, r.port, r.why])).toEqual([
      ["blocked.test", 443, "blocked"],
      ["mine.test", 443, "blocked"],
      ["a.private.test", 443, "blocked"],
      ["rebind.test", 443, "address"],
      ["metadata.test", 443, "address"],
      ["169.254.169.254", 443, "address"],
      ["nxdomain.test", 443, "dns"],
      ["api.test", 22, "bad_target"],
      ["down.test", 443, "unreachable"],
    ]);
    expect(refused.find((r) => r.host === "rebind.test")?.detail).toBe("10.0.0.1 is private");

    // Through undici, the refusal reaches the caller of pool.request() as the TunnelError.
    const error = await refusalOf(
      pool(proxy.client, "https://blocked.test").request({ path: "/", method: "GET" }),
    );
    expect(error.kind).toBe("blocked");
    expect(error.message).not.toContain(PROXY_TOKEN);
  });

  it("case I5: refuses a name resolving to an IP literal the policy or --block names, in any spelling", async () => {
    const relay = await newRelay(policy(1, [{ pattern: "[64:ff9b::7f00:3]", action: "block" }]));
    const agent = newAgent(relay, { block: ["[2002:7f00:4::]"] });
    await agent.policyRead();
    const proxy = newClient(relay);
    await proxy.until(true);
    const kindOf = async (host: string) => (await refusalOf(proxy.client.open(host, 443))).kind;
    expect(await kindOf("ipblocked.test")).toBe("blocked");
    expect(await kindOf("ipblocked6.test")).toBe("blocked");
    expect(await kindOf("userblocked.test")).toBe("blocked");
    expect(await kindOf("[::ffff:127.0.0.3]")).toBe("blocked");
    const refused = agent.log.records.filter((r) => r.event === "refused");
    expect(refused.map((r) => [r.host, r.why, r.detail])).toEqual([
      ["ipblocked.test", "blocked", "the run's policy (127.0.0.3)"],
      ["ipblocked6.test", "blocked", "the run's policy (64:ff9b::7f00:3)"],
      ["userblocked.test", "blocked", "--block (127.0.0.4)"],
      ["127.0.0.3", "blocked", "the run's policy"],
    ]);
    // The control: a name whose address no entry names goes through.
    const stream = await proxy.client.open("api.test", 443);
    stream.destroy();
    expect(agent.log.records).toContainEqual({ event: "allowed", host: "api.test", port: 443 });
  });

  it("gives up on an agent that does not answer (unreachable) and cancels the stream", async () => {
    const relay = await newRelay();
    const agent = newAgent(relay, { lookup: () => new Promise(() => {}), dnsTimeoutMs: 60_000 });
    await agent.policyRead();
    const proxy = newClient(relay, PROXY_TOKEN, 300);
    await proxy.until(true);
    expect((await refusalOf(proxy.client.open("api.test", 443))).kind).toBe("unreachable");
    expect(proxy.client.up).toBe(true); // one stream gave up; the tunnel itself is fine
  });

  it("refuses loopback unless --allow-cidr names it", async () => {
    const { proxy } = await tunnel({ allowCidrs: [] });
    expect((await refusalOf(proxy.client.open("api.test", 443))).kind).toBe("address");
  });

  it("refuses everything until the first policy has been read", async () => {
    const relay = await newRelay(null);
    const agent = newAgent(relay);
    const proxy = newClient(relay);
    await proxy.until(true);
    await agent.log.waitFor((r) => r.event === "policy_error"); // 503: the control plane has none yet
    expect((await refusalOf(proxy.client.open("api.test", 443))).kind).toBe("blocked");
    expect(agent.log.records).toContainEqual(
      expect.objectContaining({ event: "refused", host: "api.test", detail: "no policy read yet" }),
    );
    relay.setPolicy(policy(7));
    expect((await agent.policyRead()).version).toBe(7);
    const stream = await proxy.client.open("api.test", 443);
    stream.destroy();
  });
});

describe("egress tunnel: lifecycle", () => {
  it("goes down when the agent leaves (in-flight streams fail, open says down) and comes back", async () => {
    const { relay, agent, proxy } = await tunnel();
    const p = pool(proxy.client, "https://api.test");
    const res = await p.request({ path: "/hang", method: "GET" });
    const body = res.body.text();
    await agent.log.waitFor((r) => r.event === "allowed");

    await agent.agent.stop();
    await proxy.until(false);
    await expect(body).rejects.toThrow();
    expect((await refusalOf(proxy.client.open("api.test", 443))).kind).toBe("down");
    expect((await refusalOf(p.request({ path: "/hello", method: "GET" }))).kind).toBe("down");

    // A new agent pairs; the proxy reconnected on its own and works again.
    const second = newAgent(relay);
    await second.policyRead();
    await proxy.until(true);
    const again = await p.request({ path: "/hello", method: "GET" });
    expect(await again.body.text()).toBe("hello from api.test");
    expect(relay.accepted.proxy).toBeGreaterThanOrEqual(2);
  });

  it("hands over to a newer agent: the old one exits, the proxy pairs with the new one", async () => {
    const { relay, agent, proxy } = await tunnel();
    const second = newAgent(relay);
    expect(await agent.agent.done).toBe(1);
    expect(agent.log.records).toContainEqual({
      event: "stopped",
      code: 1,
      why: "another egress agent connected with this token",
    });
    await proxy.log.nth("tunnel_up", 2);
    const res = await pool(proxy.client, "https://api.test").request({ path: "/hello", method: "GET" });
    expect(await res.body.text()).toBe("hello from api.test");
    expect(second.log.records).toContainEqual({ event: "allowed", host: "api.test", port: 443 });
  });

  it("keeps retrying a refused upgrade on the proxy's side, and stays down", async () => {
    const relay = await newRelay();
    newAgent(relay);
    const proxy = newClient(relay, randomBytes(32).toString("base64url"));
    await proxy.log.nth("tunnel_refused", 2);
    expect(proxy.log.records.find((r) => r.event === "tunnel_refused")).toEqual({
      event: "tunnel_refused",
      status: 401,
    });
    expect(proxy.client.up).toBe(false);
  });

  it("stops both ends for good when the run ends", async () => {
    const { relay, agent, proxy } = await tunnel();
    relay.endRun();
    expect(await agent.agent.done).toBe(0);
    await proxy.log.waitFor((r) => r.event === "tunnel_stopped");
    expect(proxy.client.up).toBe(false);
    expect((await refusalOf(proxy.client.open("api.test", 443))).kind).toBe("down");
    expect(agent.log.records).toContainEqual({ event: "stopped", code: 0, why: "the run ended" });
    expect(relay.accepted).toEqual({ proxy: 1, agent: 1 });
  });

  it("exits 1 when the token is revoked, or refused at the upgrade", async () => {
    const { relay, agent, proxy } = await tunnel();
    relay.revokeAgent();
    expect(await agent.agent.done).toBe(1);
    await proxy.until(false);

    const other = await newRelay();
    const stranger = newAgent(other, { token: `bwe_${randomBytes(32).toString("base64url")}` });
    expect(await stranger.agent.done).toBe(1);
    expect(stranger.log.records).toContainEqual(
      expect.objectContaining({ why: "the token was revoked or the run is over" }),
    );
  });
});
