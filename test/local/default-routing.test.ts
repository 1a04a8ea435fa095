import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PROXY_PORTS, type SandboxInfo } from "@benchwright/shared/contract/local-agent";
import { compilePolicy } from "@benchwright/shared/policy/compile";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RunningAgent, startAgent } from "../../local-agent/server";
import { createTestCa, type TestCa } from "../../scripts/lib/test-ca";
import { FakeControlPlane } from "../proxy/control-plane";
import { AgentClient, ensureWorkImageBuilt, host, leftovers, secret, until, whyNotRunnable } from "./harness";

// Case I4 on real namespaces: a run under default routing (its vault blocks one exact host, so
// the policy is default-routed), the real host agent making the proxy and work sandboxes with
// veth and nftables, the real proxy (bw-proxy) in its sandbox against a contract double of the
// control plane, and an upstream in a namespace this suite makes (10.240.4.2) that serves both
// names with a CA of its own. The client in the work sandbox resolves the names itself
// (`curl --resolve`), so the hosts file never sees them: only the agent's DNAT of 80/443 and
// the proxy's reading of SO_ORIGINAL_DST bring the connection to a decision. The names are
// under .test and the proxy has no route for them: what reaches the upstream was relayed to the
// address the client dialled, nothing resolved.

const whyNot = whyNotRunnable();
const UIDS: [number, number] = [340_000, 340_400];
const UP_NS = "bwt-i4up";
const UP_LINK = "bwt-i4uph";
const UP = "10.240.4.2";
const ALLOWED = "allowed.i4.test";
const BLOCKED = "blocked.i4.test";
const OWN_CA_NAME = "I4 upstream own CA";

// env BW_I4_CERT, BW_I4_KEY. HTTPS 443 and HTTP 80 answer "upstream:<host>:<path>" and log
// "seen:<scheme>:<host>:<path>"; UDP 443 logs "udp:443:<text>".
const UPSTREAM = `
const https = require("https"), http = require("http"), dgram = require("dgram");
const cert = process.env.BW_I4_CERT, key = process.env.BW_I4_KEY;
const answer = (scheme) => (req, res) => {
  console.log("seen:" + scheme + ":" + req.headers.host + ":" + req.url);
  res.end("upstream:" + req.headers.host + ":" + req.url);
};
https.createServer({ cert, key }, answer("https")).listen(443, "${UP}");
http.createServer(answer("http")).listen(80, "${UP}");
const u = dgram.createSocket("udp4");
u.on("message", (m, from) => { console.log("udp:443:" + m); u.send("upstream-udp", from.port, from.address); });
u.bind(443, "${UP}", () => setTimeout(() => console.log("ready"), 50));
`;

class Lines {
  readonly lines: string[] = [];
  constructor(child: ChildProcess) {
    let buffer = "";
    child.stdout?.on("data", (d: Buffer) => {
      buffer += d.toString();
      const parts = buffer.split("\n");
      buffer = parts.pop() ?? "";
      this.lines.push(...parts);
    });
  }
  has(line: string): boolean {
    return this.lines.includes(line);
  }
}

async function removeUpstreamNs(): Promise<void> {
  for (const pid of (await host(["ip", "netns", "pids", UP_NS])).stdout.split(/\s+/).filter(Boolean)) {
    try {
      process.kill(Number(pid), "SIGKILL");
    } catch {}
  }
  await host(["ip", "link", "del", UP_LINK]);
  await host(["ip", "netns", "del", UP_NS]);
}

describe.skipIf(whyNot !== null)("case I4: exact blocks under default routing, on real namespaces", () => {
  let ownCa: TestCa;
  let upstream: ChildProcess;
  let seen: Lines;
  let control: FakeControlPlane;
  let agent: RunningAgent;
  let api: AgentClient;
  let stateDir: string;
  let work: SandboxInfo;
  let proxyExec: string;
  const agentSecret = secret();
  const ipForwardBefore = readFileSync("/proc/sys/net/ipv4/ip_forward", "utf8").trim();

  /** curl in the work sandbox's execute stage; `-w` appends the status on a line of its own. */
  const curl = (args: string[]) =>
    api.run("wk1", {
      argv: ["curl", "-sS", "-v", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}", ...args],
      stage: "execute",
    });
  const status = (out: string) => Number(out.slice(out.lastIndexOf("\n") + 1));
  const proxyLog = async (): Promise<Array<Record<string, unknown>>> =>
    (await api.poll("px1", proxyExec)).stdout
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  const decisionFor = async (hostName: string, listener: string) => {
    let hit: Record<string, unknown> | undefined;
    await until(`a ${listener} decision for ${hostName}`, async () => {
      hit = (await proxyLog()).find(
        (r) => r.event === "decision" && r.host === hostName && r.listener === listener,
      );
      return hit !== undefined;
    });
    return hit as Record<string, unknown>;
  };
  const routeRows = () =>
    [...control.batches.values()].flatMap((b) => b.egressRoutes.map((r) => [r.host, r.route]));

  beforeAll(async () => {
    await ensureWorkImageBuilt();
    ownCa = await createTestCa(OWN_CA_NAME);
    const leaf = await ownCa.issue([ALLOWED, BLOCKED]);
    await removeUpstreamNs();
    for (const step of [
      ["ip", "netns", "add", UP_NS],
      ["ip", "link", "add", UP_LINK, "type", "veth", "peer", "name", "eth0", "netns", UP_NS],
      ["ip", "addr", "add", "10.240.4.1/30", "dev", UP_LINK],
      ["ip", "link", "set", UP_LINK, "up"],
      ["ip", "-n", UP_NS, "addr", "add", `${UP}/30`, "dev", "eth0"],
      ["ip", "-n", UP_NS, "link", "set", "eth0", "up"],
      ["ip", "-n", UP_NS, "link", "set", "lo", "up"],
      ["ip", "-n", UP_NS, "route", "add", "default", "via", "10.240.4.1"],
    ]) {
      const r = await host(step);
      if (r.code !== 0) throw new Error(`${step.join(" ")}: ${r.stderr}`);
    }
    upstream = spawn("ip", ["netns", "exec", UP_NS, "node", "-e", UPSTREAM], {
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", BW_I4_CERT: leaf.certPem, BW_I4_KEY: leaf.keyPem },
      stdio: ["ignore", "pipe", "inherit"],
    });
    seen = new Lines(upstream);
    await until("the upstream", () => seen.has("ready"));

    control = new FakeControlPlane("run_i4", {
      version: 1,
      default: "allow",
      hosts: [{ pattern: BLOCKED, action: "block" }],
      rules: [],
    });
    await control.start();
    stateDir = mkdtempSync(join(tmpdir(), "bw-i4-"));
    agent = await startAgent({
      secret: agentSecret,
      port: 0,
      controlPlane: control.url,
      stateDir,
      uidBase: UIDS[0],
      log: () => {},
      // The upstream is on a private address the proxy and the direct route may reach: a test host.
      proxyTestEnv: { BW_TEST_ALLOW_CIDRS: "10.240.4.0/30" },
    });
    api = new AgentClient(agent.url, agentSecret);
    await api.create({ kind: "proxy", id: "px1", runId: "run_i4" });
    work = await api.create({
      kind: "work",
      id: "wk1",
      runId: "run_i4",
      proxySandboxId: "px1",
      routing: "default",
    });
    const ready = control.nextReady();
    const started = await api.start("px1", {
      argv: ["bw-proxy"],
      stage: "setup", // as the coordinator launches it
      timeoutMs: null,
      env: {
        BW_RUN_ID: "run_i4",
        BW_PROXY_TOKEN: control.token,
        BW_AUDIT_KEY: control.auditKey,
        BW_SPOOL_DIR: "/tmp/benchwright-spool",
        BW_LISTEN_HOST: "0.0.0.0",
        BW_TLS_PORT: String(PROXY_PORTS.tls),
        BW_HTTP_PORT: String(PROXY_PORTS.http),
        BW_EXPLICIT_PORT: String(PROXY_PORTS.explicit),
        BW_DIRECT_TLS_PORT: String(PROXY_PORTS.directTls),
        BW_DIRECT_HTTP_PORT: String(PROXY_PORTS.directHttp),
      },
    });
    proxyExec = started.execId;
    const { caCertPem } = await ready;
    // The client trusts the run CA (as the wiring makes it) in one file, the upstream's own in another.
    await api.run("wk1", { argv: ["sh", "-c", "cat > /tmp/run-ca.pem"], stage: "execute", stdin: caCertPem });
    await api.run("wk1", {
      argv: ["sh", "-c", "cat > /tmp/own-ca.pem"],
      stage: "execute",
      stdin: ownCa.certPem,
    });
  }, 300_000);

  afterAll(async () => {
    await agent?.close();
    await control?.close();
    upstream?.kill("SIGKILL");
    await removeUpstreamNs();
    if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  }, 60_000);

  it("case I4: the policy is default-routed: an exact block alone asks for no catch-all", () => {
    expect(compilePolicy(control.vault).routing.mode).toBe("default");
    expect(work.routing).toBe("default");
  });

  it("case I4: an exact-blocked host dialled by its address (curl --resolve) is refused with the readable 403 and recorded", async () => {
    const r = await curl([
      "--cacert",
      "/tmp/run-ca.pem",
      "--resolve",
      `${BLOCKED}:443:${UP}`,
      `https://${BLOCKED}/i4`,
    ]);
    expect(status(r.stdout)).toBe(403);
    expect(r.stdout).toContain(`Blocked by Benchwright: ${BLOCKED}`);
    expect(seen.lines.some((l) => l.includes(BLOCKED))).toBe(false);
    const record = await decisionFor(BLOCKED, "direct-tls");
    expect(record).toMatchObject({ decision: "block", status: 403, blockedBy: "proxy", route: "refused" });
    await until("the blocked-host row", () => control.blockedCount(BLOCKED) >= 1);
  });

  it("case I4: a client that trusts only its own CA is refused at the handshake, and still recorded", async () => {
    const before = control.blockedCount(BLOCKED);
    const r = await curl([
      "--cacert",
      "/tmp/own-ca.pem",
      "--resolve",
      `${BLOCKED}:443:${UP}`,
      `https://${BLOCKED}/pinned`,
    ]);
    expect(r.exitCode).not.toBe(0);
    expect(seen.lines.some((l) => l.includes("/pinned"))).toBe(false);
    await until("another blocked-host row", () => control.blockedCount(BLOCKED) > before);
  });

  it("case I4: the same host dialled on port 80 is refused 403 and recorded", async () => {
    const r = await curl(["--resolve", `${BLOCKED}:80:${UP}`, `http://${BLOCKED}/plain`]);
    expect(status(r.stdout)).toBe(403);
    expect(seen.lines.some((l) => l.includes(BLOCKED))).toBe(false);
    expect(await decisionFor(BLOCKED, "direct-http")).toMatchObject({ decision: "block", status: 403 });
  });

  it("case I4: an allowed host dialled the same way reaches its upstream untouched: the upstream's own certificate", async () => {
    const r = await curl([
      "--cacert",
      "/tmp/own-ca.pem",
      "--resolve",
      `${ALLOWED}:443:${UP}`,
      `https://${ALLOWED}/ok`,
    ]);
    expect(status(r.stdout)).toBe(200);
    expect(r.stdout).toContain(`upstream:${ALLOWED}:/ok`);
    expect(r.stderr).toContain(`issuer: CN=${OWN_CA_NAME}`);
    expect(seen.has(`seen:https:${ALLOWED}:/ok`)).toBe(true);
    expect(await decisionFor(ALLOWED, "direct-tls")).toMatchObject({ mode: "splice", route: "direct" });
    await until("the direct route row", () =>
      routeRows().some(([h, route]) => h === ALLOWED && route === "direct"),
    );
  });

  it("case I4: an allowed host on port 80 is forwarded to the address dialled, recorded as reached direct", async () => {
    const r = await curl(["--resolve", `${ALLOWED}:80:${UP}`, `http://${ALLOWED}/plain`]);
    expect(status(r.stdout)).toBe(200);
    expect(seen.has(`seen:http:${ALLOWED}:/plain`)).toBe(true);
    expect(await decisionFor(ALLOWED, "direct-http")).toMatchObject({ route: "direct", status: 200 });
  });

  it("case I4: QUIC (UDP 443) is dropped under default routing, so clients fall back to TCP", async () => {
    const [quic] = await api.probe("wk1", [{ host: UP, port: 443, udp: "quic-i4" }]);
    expect(quic).toBe("noreply");
    expect(seen.has("udp:443:quic-i4")).toBe(false);
  });

  it("case I4: close() leaves no namespace, rule or process of the agent's, and forwarding as it was", async () => {
    await agent.close();
    expect(await leftovers(UIDS)).toEqual([]);
    expect(readFileSync("/proc/sys/net/ipv4/ip_forward", "utf8").trim()).toBe(ipForwardBefore);
  });
});
