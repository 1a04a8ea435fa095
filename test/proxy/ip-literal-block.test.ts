import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  createTestCa,
  curl,
  curlTls,
  type RunningProxy,
  startProxy,
  startTlsUpstream,
  type TestCa,
  type Upstream,
  vault,
} from "./harness";

// Case I5 on the proxy: a block entry that is an IP literal also refuses every name that resolves
// to that address, and the address's IPv6 spellings (NAT64, 6to4, IPv4-compatible, mapped) are
// the same address. Real TLS upstreams listen on the blocked loopback addresses, so a request
// let through would reach them: each test asserts nothing did. Under catch-all routing a blocked
// name is never spliced (I3): its refusal falls back to termination and a readable 403.

const NAMES = {
  "ok.test": "127.0.0.2",
  "v4.test": "127.0.0.3",
  "nat64.test": "127.0.0.4",
  "sixtofour.test": "127.0.0.5",
  "compat.test": "127.0.0.6",
} as const;

let ca: TestCa;
const upstreams: Record<string, Upstream> = {};
let proxy: RunningProxy;

beforeAll(async () => {
  ca = await createTestCa();
  for (const [name, address] of Object.entries(NAMES)) {
    upstreams[name] = await startTlsUpstream({ ca, hosts: [name, "reverse.test"], address });
  }
  proxy = await startProxy({
    vault: vault({
      hosts: [
        { pattern: "127.0.0.3", action: "block" },
        { pattern: "[64:ff9b::7f00:4]", action: "block" }, // NAT64 spelling of 127.0.0.4
        { pattern: "[2002:7f00:5::]", action: "block" }, // 6to4 spelling of 127.0.0.5
        { pattern: "[::7f00:6]", action: "block" }, // IPv4-compatible spelling of 127.0.0.6
        { pattern: "127.0.0.7", action: "block" },
        // An allow entry for the name does not undo the block of its address.
        { pattern: "v4.test", action: "allow" },
      ],
    }),
    routes: upstreams,
    upstreamCa: ca,
    testAllowCidrs: ["127.0.0.2/31", "127.0.0.4/30"],
    upstream: {
      // A name with no route resolves here: to the NAT64 spelling of a blocked IPv4 address.
      lookup: async (host) => {
        if (host === "reverse.test") return ["64:ff9b::7f00:7"];
        throw new Error(`no DNS in tests (${host})`);
      },
    },
  });
});

afterAll(async () => {
  await proxy.close();
  await Promise.all(Object.values(upstreams).map((u) => u.close()));
});

const total = () => Object.values(upstreams).reduce((n, u) => n + u.counts.connections, 0);

describe("case I5: an IP-literal block entry refuses the names that resolve to it", () => {
  it("lets a name through whose address is not blocked (the control)", async () => {
    // IP-literal blocks make the routing catch-all, where an allowed host without a rule is
    // spliced (I3): the client then verifies the upstream's own certificate.
    const caFile = join(mkdtempSync(join(tmpdir(), "bw-i5-")), "ca.pem");
    writeFileSync(caFile, ca.certPem);
    const res = await curl([
      "--cacert",
      caFile,
      "--connect-to",
      `ok.test:443:127.0.0.1:${proxy.tlsPort}`,
      "https://ok.test/",
    ]);
    expect(res.status).toBe(200);
    expect(upstreams["ok.test"]?.counts.requests).toBe(1);
  });

  it.each([
    ["v4.test", "127.0.0.3", "127.0.0.3"],
    ["nat64.test", "127.0.0.4", "[64:ff9b::7f00:4]"],
    ["sixtofour.test", "127.0.0.5", "[2002:7f00:5::]"],
    ["compat.test", "127.0.0.6", "[::7f00:6]"],
  ])("case I5: %s (resolves to %s) is refused by the entry %s", async (name, address, entry) => {
    const before = total();
    const blockedBefore = proxy.audit.blocked.length;
    const res = await curlTls(proxy, `https://${name}/`);
    expect(res.status).toBe(403);
    expect(res.body).toContain(`Blocked by Benchwright: ${name} is not reachable`);
    expect(res.body).toContain("resolves to an address this run's policy blocks");
    expect(total()).toBe(before);
    expect(proxy.dials.filter((d) => d.host === name)).toEqual([]);
    expect(proxy.audit.blocked.slice(blockedBefore)).toEqual([name]);
    const decision = proxy.logs.findLast((r) => r.event === "decision" && r.host === name);
    expect(decision).toMatchObject({
      decision: "block",
      status: 403,
      reason: `${address} is blocked by ${entry}`,
    });
  });

  it("case I5: refuses a name whose DNS answer is another spelling (NAT64) of a blocked address", async () => {
    const res = await curlTls(proxy, "https://reverse.test/");
    expect(res.status).toBe(403);
    expect(proxy.dials.filter((d) => d.host === "reverse.test")).toEqual([]);
    expect(proxy.logs.findLast((r) => r.event === "decision" && r.host === "reverse.test")).toMatchObject({
      decision: "block",
      reason: "64:ff9b::7f00:7 is blocked by 127.0.0.7",
    });
  });

  it.each([
    ["[64:ff9b::7f00:3]", "127.0.0.3"],
    ["[2002:7f00:3::1]", "127.0.0.3"],
    ["[::ffff:127.0.0.4]", "[64:ff9b::7f00:4]"],
    ["[::127.0.0.5]", "[2002:7f00:5::]"],
  ])("case I5: the literal %s is the address the entry %s blocks", async (literal) => {
    const before = total();
    const res = await curl(["-H", `Host: ${literal}`, `http://127.0.0.1:${proxy.httpPort}/`]);
    expect(res.status).toBe(403);
    expect(total()).toBe(before);
    expect(proxy.logs.findLast((r) => r.event === "decision")).toMatchObject({
      decision: "block",
      reason: "host blocked by policy",
    });
  });
});
