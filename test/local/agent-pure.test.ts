import { spawnSync } from "node:child_process";
import { resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { OUTPUT_LIMIT, OutputBuffer } from "../../local-agent/exec";
import { proxyRuleset } from "../../local-agent/network";

// The host agent's pure parts, apart from the namespace suites (agent-*.test.ts) as they need no
// root: an exec's output buffer, the proxy namespace's ruleset as text, and its refusal to start.

describe("output buffer (pure)", () => {
  it("keeps the last 1 MiB with absolute offsets", () => {
    const b = new OutputBuffer();
    b.append(Buffer.from("abc"));
    expect(b.read(1, true)).toEqual({ text: "bc", end: 3 });
    expect(b.read(3, true)).toEqual({ text: "", end: 3 });
    expect(b.read(99, true)).toEqual({ text: "", end: 3 });
    b.append(Buffer.alloc(OUTPUT_LIMIT, "x"));
    const all = b.read(0, true);
    expect(all.text.length).toBe(OUTPUT_LIMIT);
    expect(all.end).toBe(OUTPUT_LIMIT + 3);
  });

  it("cuts pages on UTF-8 boundaries so they concatenate to the original", () => {
    const b = new OutputBuffer();
    const bytes = Buffer.from("é€😀");
    b.append(bytes.subarray(0, 4)); // "é" and 2 of the 3 bytes of "€"
    const first = b.read(0, false);
    expect(first).toEqual({ text: "é", end: 2 });
    b.append(bytes.subarray(4));
    const second = b.read(first.end, false);
    expect(first.text + second.text).toBe("é€😀");
  });

  it("writes a ruleset that refuses a work link it does not list", () => {
    const rules = proxyRuleset(3, [
      { i: 0, routing: "default" },
      { i: 1, routing: "catch-all" },
    ]);
    expect(rules).toContain('iifname "bwp3w0" ip daddr 10.232.3.1 tcp dport 443 dnat ip to 10.232.3.1:8443');
    expect(rules).toContain('iifname "bwp3w1" meta nfproto ipv4 tcp dport 443 dnat ip to 10.232.3.5:8443');
    // Default routing: every other 80/443 to the direct listeners (I4), after the hosts file's.
    const lines = rules.split("\n").map((l) => l.trim());
    const hostsTls = lines.indexOf(
      'iifname "bwp3w0" ip daddr 10.232.3.1 tcp dport 443 dnat ip to 10.232.3.1:8443',
    );
    expect(
      lines.indexOf('iifname "bwp3w0" meta nfproto ipv4 tcp dport 443 dnat ip to 10.232.3.1:8444'),
    ).toBeGreaterThan(hostsTls);
    expect(rules).toContain('iifname "bwp3w0" meta nfproto ipv4 tcp dport 80 dnat ip to 10.232.3.1:8081');
    expect(rules).not.toContain(
      'iifname "bwp3w1" meta nfproto ipv4 tcp dport 443 dnat ip to 10.232.3.5:8444',
    );
    expect(rules).toContain("ct status dnat tcp dport { 8444, 8081 } accept");
    expect(rules).toContain('iifname { "bwp3w0" } udp dport 443 reject');
    expect(rules).toContain('meta nfproto ipv4 iifname { "bwp3w0" } oifname "up0" accept');
    expect(rules).not.toMatch(/"bwp3w1" }? oifname "up0"/);
    expect(rules).toMatch(/ip daddr \{ 10\.231\.0\.0\/16, 10\.232\.0\.0\/16, 169\.254\.0\.0\/16 \} reject/);
  });

  it("refuses direct traffic to private, shared and multicast ranges but the ones it is told about", () => {
    const rules = proxyRuleset(3, [{ i: 0, routing: "default" }], {
      allowCidrs: ["10.240.0.0/30"],
      nameservers: ["192.168.1.1"],
    });
    const lines = rules.split("\n").map((l) => l.trim());
    const at = (needle: string) => lines.findIndex((l) => l.includes(needle));
    const refuse = at("ip daddr { 0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10");
    expect(refuse).toBeGreaterThan(0);
    expect(lines[refuse]).toContain("192.168.0.0/16");
    expect(lines[refuse]).toContain("172.16.0.0/12");
    // Exceptions come first: this run's probe listener and the test upstreams; resolvers on 53 only.
    expect(at("ip daddr { 10.233.3.1, 10.240.0.0/30 } accept")).toBeLessThan(refuse);
    expect(at("ip daddr { 192.168.1.1 } meta l4proto { tcp, udp } th dport 53 accept")).toBeLessThan(refuse);
    expect(at('meta nfproto ipv4 iifname { "bwp3w0" } oifname "up0" accept')).toBeGreaterThan(refuse);
  });
});

describe("the agent's command (main.ts)", () => {
  it("refuses to start without its secret: one JSON log line with its event, exit 2", () => {
    const main = resolve(import.meta.dirname, "../../local-agent/main.ts");
    const tsx = resolve(import.meta.dirname, "../../node_modules/.bin/tsx");
    const r = spawnSync(tsx, [main, "--port", "0"], {
      env: { PATH: process.env.PATH, LOCAL_AGENT_SECRET: "too-short" },
      encoding: "utf8",
    });
    expect(r.status).toBe(2);
    const lines = r.stderr.trim().split("\n");
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0] as string)).toMatchObject({ level: "error", event: "agent_start_failed" });
    expect(r.stderr).not.toContain("too-short");
  });
});
