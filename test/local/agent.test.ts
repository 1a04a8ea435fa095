import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OUTPUT_LIMIT, OutputBuffer } from "../../local-agent/exec";
import { proxyRuleset } from "../../local-agent/network";
import { ROOTFS_UID_BASE } from "../../local-agent/rootfs";
import { REPO_ROOT, type RunningAgent, startAgent } from "../../local-agent/server";
import { localBackend } from "../../src/broker/local-backend";
import { AgentHealth, type ExecRequest, type SandboxInfo, SandboxList } from "../../src/contract/local-agent";
import { DEFAULT_VIEW_PORT, ProxyView } from "../../src/contract/proxy-view";
import {
  AgentClient,
  ensureWorkImageBuilt,
  host,
  leftovers,
  nftFailingCatchAll,
  secret,
  startControlPlane,
  TestUpstream,
  until,
  whyNotRunnable,
} from "./harness";

// The local backend's host agent against real namespaces, nftables and processes. Needs root on
// Linux (CI runs as root); elsewhere the namespace suites are skipped and say why.

const whyNot = whyNotRunnable();
if (whyNot)
  console.warn(`local agent suites skipped: ${whyNot} (they need root on Linux with ip, nft, unshare)`);

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

const UIDS: [number, number] = [320_000, 320_400];

function hostPort(target: string | null): { host: string; port: number } {
  const [h, p] = (target ?? "").split(":");
  return { host: h as string, port: Number(p) };
}
const HOST_TMP_MARKER = `bw-host-tmp-${process.pid}`;

/** What a stand-in for the proxy serves on 127.0.0.1:<port>/view (generatedAt: when it answers). */
const STAND_IN_VIEW: ProxyView = {
  runId: "run1",
  startedAt: new Date().toISOString(),
  generatedAt: new Date().toISOString(),
  policyVersion: 3,
  policyState: "ready",
  counts: { requests: 0, allow: 0, block: 0, refuse: 0, error: 0, injected: 0 },
  recent: [],
  audit: {
    rowsRecorded: 0,
    rowsSent: 0,
    rowsRejected: 0,
    rowsRefused: 0,
    batchesSent: 0,
    batchesRejected: 0,
    pendingBatches: 0,
    accepting: true,
  },
};
// argv: [marker, view JSON, port]. The marker names it in `ps`.
const VIEW_STAND_IN = `
const view = JSON.parse(process.argv[2]);
require("http")
  .createServer((req, res) => res.end(JSON.stringify({ ...view, generatedAt: new Date().toISOString() })))
  .listen(Number(process.argv[3]), "127.0.0.1", () => console.log("ready"));`;

/** The `ps` state letter (R, S, T...) of the sandbox process whose command line has `marker`. */
async function stateOf(api: AgentClient, sandboxId: string, marker: string): Promise<string | undefined> {
  const ps = await api.sh(sandboxId, "ps -eo stat=,args=", "setup");
  const line = ps.stdout.split("\n").find((l) => l.includes(marker) && !l.includes("ps -eo"));
  return line?.trim()[0];
}

describe.skipIf(whyNot !== null)("local agent: sandboxes in namespaces", () => {
  let agent: RunningAgent;
  let api: AgentClient;
  let controlPlane: Awaited<ReturnType<typeof startControlPlane>>;
  let upstream: TestUpstream;
  let stateDir: string;
  let ipForwardBefore: string;
  const logs: string[] = [];
  const canary = `canary-${secret()}`;
  const agentSecret = secret();
  let proxy: SandboxInfo;
  let work: SandboxInfo; // default routing
  let catchAll: SandboxInfo;
  const marker = `bw-marker-${secret().slice(0, 12)}`;

  beforeAll(async () => {
    await ensureWorkImageBuilt();
    ipForwardBefore = readFileSync("/proc/sys/net/ipv4/ip_forward", "utf8").trim();
    writeFileSync(join("/tmp", HOST_TMP_MARKER), "host");
    stateDir = mkdtempSync(join(tmpdir(), "bw-agent-test-"));
    controlPlane = await startControlPlane();
    upstream = await TestUpstream.start();
    agent = await startAgent({
      secret: agentSecret,
      port: 0,
      controlPlane: controlPlane.url,
      stateDir,
      uidBase: UIDS[0],
      log: (event) => logs.push(JSON.stringify(event)),
      // The suite's upstream is on a private address: direct traffic may reach it, as a test host.
      proxyTestEnv: { BW_TEST_ALLOW_CIDRS: "10.240.0.0/30" },
    });
    api = new AgentClient(agent.url, agentSecret);
    proxy = await api.create({ kind: "proxy", id: "px1", runId: "run1" });
    work = await api.create({
      kind: "work",
      id: "wk1",
      runId: "run1",
      proxySandboxId: "px1",
      routing: "default",
    });
    catchAll = await api.create({
      kind: "task",
      id: "tk1",
      runId: "run1",
      proxySandboxId: "px1",
      routing: "catch-all",
    });
    // Stand-ins for the proxy's listeners (TLS 8443, HTTP 8080, direct 8444 / 8081, DNS 5353),
    // run as the proxy is.
    await api.serve(
      "px1",
      `const net = require("net"), dgram = require("dgram");
       for (const port of [8443, 8080, 8444, 8081]) net.createServer((s) => s.end("proxy:" + port)).listen(port);
       const d = dgram.createSocket("udp4");
       d.on("message", (m, from) => d.send("dns:" + m, from.port, from.address));
       d.bind(5353, () => console.log("ready"));`,
    );
  }, 300_000);

  afterAll(async () => {
    await agent?.close();
    await upstream?.stop();
    await controlPlane?.close();
    rmSync(join("/tmp", HOST_TMP_MARKER), { force: true });
    if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  }, 30_000);

  it("refuses a call without the secret or with a wrong one (401 unauthorized)", async () => {
    for (const auth of [null, "wrong-secret-wrong-secret", `${agentSecret}x`]) {
      const res = await api.call("GET", "/v1/health", undefined, auth);
      expect(res.status).toBe(401);
      expect(res.body.code).toBe("unauthorized");
    }
    const res = await api.call("POST", "/v1/sandboxes", { kind: "proxy", id: "nope", runId: "r" }, null);
    expect(res.status).toBe(401);
    expect((await api.call("GET", "/v1/sandboxes?runId=r")).body.sandboxes).toEqual([]);
  });

  it("refuses bad bodies with 400 invalid_request", async () => {
    const bad: unknown[] = [
      "{not json",
      { kind: "proxy", id: "bad id!", runId: "r" },
      { kind: "proxy", id: "ok", runId: "r", extra: 1 },
      { kind: "work", id: "ok", runId: "r", proxySandboxId: "px1" },
      { kind: "vm", id: "ok", runId: "r" },
    ];
    for (const body of bad) {
      const res = await api.call("POST", "/v1/sandboxes", body);
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect(res.body.code).toBe("invalid_request");
    }
    const exec = await api.call("POST", "/v1/sandboxes/wk1/exec", { argv: ["true"], stage: "root" });
    expect([exec.status, exec.body.code]).toEqual([400, "invalid_request"]);
    const unknown = await api.call("POST", "/v1/sandboxes/wk1/exec", { argv: [], stage: "setup" });
    expect([unknown.status, unknown.body.code]).toEqual([400, "invalid_request"]);
    const poll = await api.call("GET", "/v1/sandboxes/wk1/exec/x?waitMs=-1");
    expect([poll.status, poll.body.code]).toEqual([400, "invalid_request"]);
    const missing = await api.call("POST", "/v1/sandboxes/nosuch/exec", { argv: ["true"], stage: "setup" });
    expect([missing.status, missing.body.code]).toEqual([404, "not_found"]);
  });

  it("reports this machine healthy", async () => {
    const res = await api.call("GET", "/v1/health");
    expect(res.status).toBe(200);
    expect(AgentHealth.parse(res.body)).toEqual({ ok: true, problems: [] });
  });

  it("describes the sandboxes it made, and answers a repeated create with the same sandbox", async () => {
    expect(proxy).toMatchObject({ kind: "proxy", state: "ready", proxyAddress: null, routing: null });
    expect(proxy.controlPlaneUrl).toMatch(/^http:\/\/10\.231\.\d+\.1:\d+$/);
    expect(work).toMatchObject({ kind: "work", routing: "default", controlPlaneUrl: null });
    expect(work.proxyAddress).toMatch(/^10\.232\.\d+\.1$/);
    expect(catchAll).toMatchObject({ kind: "task", routing: "catch-all" });
    expect(work.probeTarget).toMatch(/^10\.233\.\d+\.1:\d+$/);
    const again = await api.call("POST", "/v1/sandboxes", {
      kind: "work",
      id: "wk1",
      runId: "run1",
      proxySandboxId: "px1",
      routing: "default",
    });
    expect(again.status).toBe(200);
    expect(again.body).toEqual(work);
    const other = await api.call("POST", "/v1/sandboxes", {
      kind: "work",
      id: "wk1",
      runId: "run1",
      proxySandboxId: "px1",
      routing: "catch-all",
    });
    expect([other.status, other.body.code]).toEqual([400, "invalid_request"]);
    const listed = await api.call("GET", "/v1/sandboxes?runId=run1");
    expect(listed.body.sandboxes?.map((s: SandboxInfo) => s.id).sort()).toEqual(["px1", "tk1", "wk1"]);
  });

  it("runs the execute stage as an unprivileged uid with no capabilities", async () => {
    // The sandbox's user namespace maps inner 0 (setup) to the owner of the work image's files,
    // inner 1 (execute) to the sandbox's own host uid U+1, and the image's other uids above base.
    const setup = await api.sh("wk1", "cat /proc/self/uid_map; id -u", "setup");
    const lines = setup.stdout.trim().split("\n");
    const map = lines.slice(0, 3).map((l) => l.trim().split(/\s+/).map(Number));
    expect(map[0]).toEqual([0, ROOTFS_UID_BASE, 1]);
    expect(map[1]?.[0]).toBe(1);
    expect(map[1]?.[1]).toBeGreaterThanOrEqual(UIDS[0]);
    expect(map[1]?.[2]).toBe(1);
    expect(map[2]).toEqual([2, ROOTFS_UID_BASE + 2, 65_534]);
    expect(lines[3]).toBe("0");
    const exec = await api.sh(
      "wk1",
      "id -u; grep -E '^(CapInh|CapEff|CapPrm|CapAmb|NoNewPrivs|Groups)' /proc/self/status; readlink /proc/self",
    );
    const [uid, ...rest] = exec.stdout.trim().split("\n");
    expect(Number(uid)).toBe(1); // host uid U+1: neither root nor the setup stage's uid
    const status = Object.fromEntries(rest.slice(0, 6).map((l) => l.split(/:\s*/) as [string, string]));
    for (const cap of ["CapInh", "CapPrm", "CapEff", "CapAmb"]) expect(status[cap], cap).toMatch(/^0{16}$/);
    expect(status.NoNewPrivs).toBe("1");
    expect(status.Groups).toBe(""); // no supplementary group
    // CapBnd is not asserted: entering a user namespace resets the bounding set, and nothing of the
    // sandbox may run privileged to drop it. No capability can be gained with no_new_privs.
    expect(rest[6]).toMatch(/^\d+$/); // /proc/self works: it is the sandbox's own PID namespace
  });

  it("hides the checkout (with its .data and any .dev.vars) from both stages", async () => {
    for (const stage of ["execute", "setup"] as const) {
      const res = await api.sh("wk1", `ls -A ${REPO_ROOT}; cat ${REPO_ROOT}/package.json; echo done`, stage);
      expect(res.stdout.trim(), stage).toBe("done");
      expect(res.stderr, stage).toContain("No such file");
    }
  });

  it("gives both stages the agent's own Node, read-only, for the image's programs", async () => {
    // The pinned Node 24 (under the hidden checkout) appears at /run/bw-node; no stage can change it.
    for (const stage of ["execute", "setup"] as const) {
      const res = await api.sh("wk1", "/run/bw-node --version; : > /run/bw-node && echo wrote", stage);
      expect(res.stdout.trim(), stage).toBe(process.version);
      expect(res.stderr, stage).toMatch(/Read-only file system|Permission denied/);
    }
  });

  it("lets no stage make a user namespace of its own (to shadow /etc/hosts there)", async () => {
    const shadow =
      "echo '10.0.0.9 api.example.test' > $HOME/hosts; unshare -Urm sh -c \"mount --bind $HOME/hosts /etc/hosts && cat /etc/hosts\"";
    for (const stage of ["execute", "setup"] as const) {
      const res = await api.sh("wk1", shadow, stage);
      expect(res.exitCode, stage).not.toBe(0);
      expect(res.stdout, stage).not.toContain("10.0.0.9");
      expect(res.stderr, stage).toMatch(/unshare failed/);
    }
    // The host's own limit is untouched: only the sandbox's namespace forbids more of them.
    expect(Number((await host(["cat", "/proc/sys/user/max_user_namespaces"])).stdout)).toBeGreaterThan(0);
  });

  it("lets the setup stage write /etc/hosts and the execute stage only read it", async () => {
    const write = await api.sh("wk1", `echo "${work.proxyAddress} api.example.test" >> /etc/hosts`, "setup");
    expect(write.exitCode).toBe(0);
    const denied = await api.sh("wk1", "echo '10.0.0.9 evil.test' >> /etc/hosts");
    expect(denied.exitCode).not.toBe(0);
    expect((await api.sh("wk1", "cat /etc/hosts")).stdout).toContain("api.example.test");
    expect((await api.sh("wk1", "cat /etc/hosts")).stdout).not.toContain("evil.test");
  });

  it("denies both stages any change to the sandbox's network", async () => {
    // SIOCSIFFLAGS on lo (what `ip link set lo down` does; the image has no iproute2).
    const down = `python3 -c "import fcntl, socket, struct; fcntl.ioctl(socket.socket(), 0x8914, struct.pack('16sH', b'lo', 0))"`;
    for (const stage of ["setup", "execute"] as const) {
      const r = await api.sh("wk1", down, stage);
      expect(r.exitCode, stage).not.toBe(0);
      expect(r.stderr).toMatch(/Operation not permitted/);
    }
    const mounts = await api.sh("wk1", "umount /tmp || umount /proc || mount -t tmpfs x /mnt", "setup");
    expect(mounts.exitCode).not.toBe(0);
  });

  it("hides the proxy sandbox's processes and the host's from a work sandbox", async () => {
    const started = await api.start("px1", {
      argv: ["node", "-e", "setInterval(() => {}, 1000)", marker],
      stage: "setup",
      timeoutMs: 60_000,
    });
    const cmdlines = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done";
    // The check can see a marker where there is one (once the started process runs).
    await until("the marker to run in the proxy sandbox", async () =>
      (await api.sh("px1", cmdlines, "setup")).stdout.includes(marker),
    );
    for (const stage of ["setup", "execute"] as const) {
      const seen = await api.sh("wk1", `${cmdlines}; ps -eo args`, stage);
      expect(seen.stdout).not.toContain(marker);
      expect(seen.stdout).not.toContain("vitest");
    }
    await api.call("POST", `/v1/sandboxes/px1/exec/${started.execId}/kill`);
  });

  it("gives each sandbox an IPC namespace of its own, the same in both stages", async () => {
    const ipc = async (id: string, stage: "setup" | "execute") =>
      (await api.sh(id, "readlink /proc/self/ns/ipc", stage)).stdout.trim();
    const [wkSetup, wkExec, tk, px] = await Promise.all([
      ipc("wk1", "setup"),
      ipc("wk1", "execute"),
      ipc("tk1", "execute"),
      ipc("px1", "setup"),
    ]);
    expect(wkSetup).toMatch(/^ipc:\[\d+\]$/);
    expect(wkExec).toBe(wkSetup);
    expect(new Set([readlinkSync("/proc/self/ns/ipc"), wkExec, tk, px]).size).toBe(4);
  });

  it("gives each sandbox a private, empty /tmp", async () => {
    expect((await api.sh("wk1", "ls -A /tmp")).stdout).toBe("");
    expect((await api.sh("wk1", `ls /tmp/${HOST_TMP_MARKER}`)).exitCode).not.toBe(0);
    expect((await api.sh("wk1", "echo mine > /tmp/private-file")).exitCode).toBe(0);
    expect((await api.sh("tk1", "ls -A /tmp")).stdout).toBe("");
    expect(existsSync("/tmp/private-file")).toBe(false);
    expect((await api.sh("wk1", "cat /tmp/private-file", "setup")).stdout).toBe("mine\n");
  });

  it("passes exactly the requested environment, never the agent's", async () => {
    process.env.BW_AGENT_ENV_PROBE = agentSecret;
    try {
      const r = await api.run("wk1", {
        argv: ["env"],
        stage: "execute",
        env: { CANARY: canary, QUOTE: "it's $HOME" },
      });
      const vars = Object.fromEntries(
        r.stdout
          .trim()
          .split("\n")
          .map((l) => [l.split("=")[0], l.slice(l.indexOf("=") + 1)]),
      );
      expect(vars.CANARY).toBe(canary);
      expect(vars.QUOTE).toBe("it's $HOME");
      expect(vars.HOME).toBe("/home/sandbox");
      expect(Object.keys(vars).sort()).toEqual(["CANARY", "HOME", "PATH", "PWD", "QUOTE"]);
      expect(r.stdout).not.toContain(agentSecret);
    } finally {
      delete process.env.BW_AGENT_ENV_PROBE;
    }
    const loader = await api.run("wk1", {
      argv: ["sh", "-c", "echo $LD_PRELOAD"],
      stage: "setup",
      env: { LD_PRELOAD: "/nonexistent/evil.so" },
    });
    expect(loader.stdout).toBe("/nonexistent/evil.so\n"); // reached the program, not nsenter
  });

  it("redirects 80/443 on the proxy's address to the proxy (default routing)", async () => {
    const [tls, http] = await api.probe("wk1", [
      { host: work.proxyAddress as string, port: 443 },
      { host: work.proxyAddress as string, port: 80 },
    ]);
    expect([tls, http]).toEqual(["proxy:8443", "proxy:8080"]);
  });

  it("lets default routing reach the upstream directly, TCP and UDP, but 80/443 through the proxy (I4)", async () => {
    const results = await api.probe("wk1", [
      { host: TestUpstream.address, port: 443 },
      { host: TestUpstream.address, port: 80 },
      { host: TestUpstream.address, port: 9000 },
      { host: TestUpstream.address, port: 9001, udp: "from-default" },
      hostPort(work.probeTarget),
      // The direct listeners take only DNAT'd connections.
      { host: work.proxyAddress as string, port: 8444 },
      { host: work.proxyAddress as string, port: 8081 },
      { host: TestUpstream.address, port: 443, udp: "quic-default" },
    ]);
    expect(results.slice(0, 5)).toEqual([
      "proxy:8444",
      "proxy:8081",
      "upstream:9000",
      "reply:upstream-udp",
      "EOF",
    ]);
    expect(results[5]).toMatch(/^ERR E(HOSTUNREACH|CONNREFUSED)/);
    expect(results[6]).toMatch(/^ERR E(HOSTUNREACH|CONNREFUSED)/);
    expect(results[7]).toBe("noreply");
    expect(upstream.received(9001, "from-default")).toBe(true);
    expect(upstream.received(443, "quic-default")).toBe(false);
  });

  it("sends every 80/443 and DNS to the proxy under catch-all, and nothing else out (A17)", async () => {
    const results = await api.probe("tk1", [
      { host: TestUpstream.address, port: 443 },
      { host: TestUpstream.address, port: 80 },
      { host: TestUpstream.address, port: 9000 },
      hostPort(catchAll.probeTarget),
      { host: TestUpstream.address, port: 53, udp: "dns-question" },
      { host: TestUpstream.address, port: 9001, udp: "from-catch-all" },
      { host: TestUpstream.address, port: 443, udp: "quic" },
    ]);
    expect(results.slice(0, 2)).toEqual(["proxy:8443", "proxy:8080"]);
    expect(results[2]).toMatch(/^ERR E(HOSTUNREACH|CONNREFUSED)/);
    expect(results[3]).toMatch(/^ERR E(HOSTUNREACH|CONNREFUSED)/);
    expect(results.slice(4)).toEqual(["reply:dns:dns-question", "noreply", "noreply"]);
    // A datagram sent after them over the open path arrives; the refused ones never did.
    await api.probe("wk1", [{ host: TestUpstream.address, port: 9001, udp: "after" }]);
    await upstream.waitFor((l) => l === "udp:9001:after");
    expect(upstream.received(9001, "from-catch-all")).toBe(false);
    expect(upstream.received(53, "dns-question")).toBe(false);
    expect(upstream.received(443, "quic")).toBe(false);
    const resolv = await api.sh(
      "tk1",
      "cat /etc/resolv.conf; cat /proc/sys/net/ipv6/conf/all/disable_ipv6; ip -6 addr",
    );
    expect(resolv.stdout).toBe(`nameserver ${catchAll.proxyAddress}\n1\n`);
  });

  it("keeps the control-plane relay out of a work sandbox's reach, in both modes", async () => {
    const relay = new URL(proxy.controlPlaneUrl as string);
    const target = { host: relay.hostname, port: Number(relay.port) };
    for (const id of ["wk1", "tk1"]) {
      const [r] = await api.probe(id, [target]);
      expect(r, id).toMatch(/^ERR E(HOSTUNREACH|CONNREFUSED)/);
    }
  });

  it("lets the proxy sandbox reach the control plane through controlPlaneUrl", async () => {
    const r = await api.run("px1", {
      argv: [
        "node",
        "-e",
        "fetch(process.argv[1]).then((r) => r.text()).then(console.log)",
        `${proxy.controlPlaneUrl}/ping`,
      ],
      stage: "setup",
    });
    expect(r.stdout.trim()).toBe("control-plane:/ping");
    // The proxy runs as `bw-proxy` (node /run/bw-image/proxy.cjs) in its setup identity.
    expect(
      (await api.run("px1", { argv: ["test", "-r", "/run/bw-image/proxy.cjs"], stage: "setup" })).exitCode,
    ).toBe(0);
  });

  it("freezes a work sandbox's processes and thaws them (halting a run)", async () => {
    const started = await api.start("wk1", { argv: ["sh", "-c", "sleep 1; echo woke"], stage: "execute" });
    expect((await api.call("POST", "/v1/sandboxes/wk1/freeze", { frozen: true })).status).toBe(204);
    const frozen = await api.poll("wk1", started.execId, "?waitMs=2000");
    expect(frozen.state).toBe("running"); // stopped: its one-second sleep cannot end
    expect((await api.call("POST", "/v1/sandboxes/wk1/freeze", { frozen: false })).status).toBe(204);
    const done = await api.poll("wk1", started.execId, "?waitMs=10000");
    expect(done).toMatchObject({ state: "exited", exitCode: 0 });
    expect(done.stdout).toContain("woke");
  });

  it("pauses a proxy sandbox and resumes it; bw-proxy-view prints the view, answered only once resumed", async () => {
    const marker = `bw-view-stand-in-${secret().slice(0, 8)}`;
    const standIn = await api.serve("px1", VIEW_STAND_IN, "setup", [
      marker,
      JSON.stringify(STAND_IN_VIEW),
      String(DEFAULT_VIEW_PORT),
    ]);
    const view = (env: Record<string, string> = {}): ExecRequest => ({
      argv: ["bw-proxy-view"],
      stage: "setup",
      env,
    });
    // Running: the view on the default port. The caller's environment does not reach the program
    // but for BW_VIEW_PORT (a NODE_OPTIONS that reached node would make it fail to start).
    const now = await api.run("px1", view({ NODE_OPTIONS: "--require /nonexistent/evil.js" }));
    expect(now).toMatchObject({ exitCode: 0, stderr: "" });
    expect(now.stdout.split("\n")).toHaveLength(2); // one line, then the newline
    expect({ ...ProxyView.parse(JSON.parse(now.stdout)), generatedAt: "x" }).toEqual({
      ...STAND_IN_VIEW,
      generatedAt: "x",
    });
    const elsewhere = await api.run("px1", view({ BW_VIEW_PORT: "9" }));
    expect(elsewhere).toMatchObject({ exitCode: 1, stdout: "" });
    expect(elsewhere.stderr).toMatch(
      /^bw-proxy-view: cannot read the proxy's view at http:\/\/127\.0\.0\.1:9\/view: /,
    );

    const listed = async () =>
      SandboxList.parse((await api.call("GET", "/v1/sandboxes?runId=run1")).body).sandboxes.find(
        (s) => s.id === "px1",
      )?.frozen;
    expect(await listed()).toBe(false);
    expect((await api.call("POST", "/v1/sandboxes/px1/freeze", { frozen: true })).status).toBe(204);
    expect(await listed()).toBe(true);
    await until("the stand-in to be stopped", async () => (await stateOf(api, "px1", marker)) === "T");
    // Paused: a read reaches the stopped stand-in's socket and waits there, unanswered.
    const pending = await api.start("px1", view());
    const k = /^10\.231\.(\d+)\.2$/.exec(proxy.address)?.[1];
    await until("the request to wait in the stand-in's socket", async () => {
      const ss = await host([
        "ip",
        "netns",
        "exec",
        `bw${k}p`,
        "ss",
        "-tniH",
        `( sport = :${DEFAULT_VIEW_PORT} )`,
      ]);
      return /bytes_received:[1-9]/.test(ss.stdout);
    });
    expect((await api.poll("px1", pending.execId)).state).toBe("running");
    const resumedAt = Date.now();
    expect((await api.call("POST", "/v1/sandboxes/px1/freeze", { frozen: false })).status).toBe(204);
    expect(await listed()).toBe(false);
    const done = await api.poll("px1", pending.execId, "?waitMs=20000");
    expect(done).toMatchObject({ state: "exited", exitCode: 0, stderr: "" });
    expect(Date.parse(ProxyView.parse(JSON.parse(done.stdout)).generatedAt)).toBeGreaterThanOrEqual(
      resumedAt,
    );
    expect(await stateOf(api, "px1", marker)).not.toBe("T");
    await api.call("POST", `/v1/sandboxes/px1/exec/${standIn.execId}/kill`);
  }, 30_000);

  it("runs bw-proxy-view in a proxy sandbox only", async () => {
    for (const id of ["wk1", "tk1"]) {
      const res = await api.call("POST", `/v1/sandboxes/${id}/exec`, {
        argv: ["bw-proxy-view"],
        stage: "setup",
      });
      expect([res.status, res.body.code, res.body.detail], id).toEqual([
        400,
        "invalid_request",
        "bw-proxy-view runs in a proxy sandbox only",
      ]);
    }
  });

  it("kills an exec at its timeout, and on request", async () => {
    const started = Date.now();
    const timed = await api.run("wk1", {
      argv: ["sh", "-c", "sleep 30 & sleep 30"],
      stage: "execute",
      timeoutMs: 300,
    });
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(timed).toMatchObject({ state: "exited", exitCode: null, signal: "SIGKILL" });
    expect((await api.sh("wk1", "ps -eo args | grep -c '^sleep 30'")).stdout.trim()).toBe("0");
    const long = await api.start("wk1", { argv: ["sleep", "30"], stage: "execute" });
    const killed = await api.call("POST", `/v1/sandboxes/wk1/exec/${long.execId}/kill`);
    expect(killed.status).toBe(200);
    expect(killed.body).toMatchObject({ state: "exited", signal: "SIGKILL" });
  });

  it("pages output by byte offsets and keeps the last 1 MiB", async () => {
    const r = await api.run("wk1", { argv: ["sh", "-c", "printf abcdef; printf err >&2"], stage: "execute" });
    expect(r).toMatchObject({ stdout: "abcdef", stdoutEnd: 6, stderr: "err", stderrEnd: 3, exitCode: 0 });
    expect(await api.poll("wk1", r.execId, "?stdoutFrom=4&stderrFrom=3")).toMatchObject({
      stdout: "ef",
      stdoutEnd: 6,
      stderr: "",
      stderrEnd: 3,
    });
    const big = await api.run("wk1", {
      argv: ["sh", "-c", "head -c 1200000 /dev/zero | tr '\\0' a; echo"],
      stage: "execute",
    });
    expect(big.stdoutEnd).toBe(1_200_001);
    expect(big.stdout.length).toBe(OUTPUT_LIMIT);
  });

  it("takes stdin, a cwd, and starts an exec with a given id once", async () => {
    const r = await api.run("wk1", {
      argv: ["sh", "-c", "pwd; cat"],
      stage: "execute",
      stdin: "hello",
      cwd: "/tmp",
    });
    expect(r.stdout).toBe("/tmp\nhello");
    const request = {
      id: "once-1",
      argv: ["sh", "-c", "echo x >> /tmp/once; cat /tmp/once | wc -l"],
      stage: "execute" as const,
    };
    const first = await api.run("wk1", request);
    const second = await api.call("POST", "/v1/sandboxes/wk1/exec", request);
    expect(second.status).toBe(200);
    expect(second.body.execId).toBe("once-1");
    expect(first.stdout.trim()).toBe("1");
    expect((await api.sh("wk1", "wc -l < /tmp/once")).stdout.trim()).toBe("1");
  });

  it("never logs an exec's environment; one line per lifecycle event", async () => {
    expect(logs.join("\n")).not.toContain(canary);
    expect(logs.filter((l) => l.includes('"sandbox_created"'))).toHaveLength(3);
  });

  it("destroys a paused proxy sandbox promptly, continuing its proxy first so that it flushes", async () => {
    const px2 = await api.create({ kind: "proxy", id: "px2", runId: "run2" });
    // A stand-in for the proxy: on SIGTERM it calls the control plane (the real one sends its
    // last audit batch), then exits.
    await api.serve(
      "px2",
      `process.on("SIGTERM", () => fetch(process.argv[1] + "/flushed").finally(() => process.exit(0)));
       setInterval(() => {}, 1000);
       console.log("ready");`,
      "setup",
      [px2.controlPlaneUrl as string, "bw-flush-stand-in"],
    );
    expect((await api.call("POST", "/v1/sandboxes/px2/freeze", { frozen: true })).status).toBe(204);
    await until(
      "the stand-in to be stopped",
      async () => (await stateOf(api, "px2", "bw-flush-stand-in")) === "T",
    );
    const all = SandboxList.parse((await api.call("GET", "/v1/sandboxes")).body).sandboxes;
    expect(all.find((s) => s.id === "px2")).toMatchObject({ runId: "run2", kind: "proxy", frozen: true });
    const started = Date.now();
    expect((await api.call("DELETE", "/v1/sandboxes/px2")).status).toBe(204);
    expect(controlPlane.paths).toContain("/flushed");
    // Stopped, the stand-in would have taken the SIGTERM only after the 5 s grace: never.
    expect(Date.now() - started).toBeLessThan(5_000);
    const after = SandboxList.parse((await api.call("GET", "/v1/sandboxes")).body).sandboxes;
    expect(after.map((s) => s.id)).not.toContain("px2");
  }, 30_000);

  it("destroys idempotently, and a destroyed work sandbox leaves nothing", async () => {
    const extra = await api.create({
      kind: "work",
      id: "wk2",
      runId: "run1",
      proxySandboxId: "px1",
      routing: "default",
    });
    const netns = (await host(["ip", "netns", "list"])).stdout;
    const name = netns
      .split("\n")
      .map((l) => l.split(" ")[0] ?? "")
      .find((n) => /^bw\d+w\d+$/.test(n) && n.endsWith(`w${2}`));
    expect(name).toBeDefined();
    for (let n = 0; n < 2; n++) expect((await api.call("DELETE", "/v1/sandboxes/wk2")).status).toBe(204);
    expect((await api.call("DELETE", "/v1/sandboxes/never-existed")).status).toBe(204);
    expect((await host(["ip", "netns", "list"])).stdout).not.toContain(`${name} `);
    expect(existsSync(join(stateDir, "sandboxes", "wk2"))).toBe(false);
    const gone = await api.call("POST", "/v1/sandboxes/wk2/exec", { argv: ["true"], stage: "setup" });
    expect([gone.status, gone.body.code]).toEqual([404, "not_found"]);
    expect(extra.address).not.toBe(work.address);
  });

  it("destroys a halted (frozen) work sandbox and its running execs promptly", async () => {
    await api.create({ kind: "work", id: "wk3", runId: "run1", proxySandboxId: "px1", routing: "default" });
    const uid = Number(
      (await api.sh("wk3", "cat /proc/self/uid_map", "setup")).stdout.trim().split(/\s+/)[1],
    );
    await api.start("wk3", { argv: ["sh", "-c", "sleep 60 & sleep 60"], stage: "execute" });
    // Freeze once they run in the sandbox: a process still on its way in is not there to stop.
    await until("the sleeps to run", async () => (await stateOf(api, "wk3", "sleep 60")) === "S");
    expect((await api.call("POST", "/v1/sandboxes/wk3/freeze", { frozen: true })).status).toBe(204);
    await until("the sleeps to be stopped", async () => (await stateOf(api, "wk3", "sleep 60")) === "T");
    const started = Date.now();
    expect((await api.call("DELETE", "/v1/sandboxes/wk3")).status).toBe(204);
    // Its execs' host-side nsenters stopped with their children: left stopped, the sandbox's PID 1
    // could not finish dying and the DELETE would wait out a 5 s fallback.
    expect(Date.now() - started).toBeLessThan(5_000);
    const processes = (await leftovers([uid, uid + 2])).filter((l) => l.startsWith("process"));
    expect(processes).toEqual([]);
    const listed = SandboxList.parse((await api.call("GET", "/v1/sandboxes")).body).sandboxes;
    expect(listed.map((s) => s.id)).not.toContain("wk3");
  }, 30_000);

  it("lists every sandbox it holds, and none it destroyed (GET /v1/sandboxes, the broker's list())", async () => {
    const res = await api.call("GET", "/v1/sandboxes");
    expect(res.status).toBe(200);
    const { sandboxes } = SandboxList.parse(res.body);
    expect(sandboxes.map((s) => [s.id, s.runId, s.kind, s.state, s.frozen]).sort()).toEqual([
      ["px1", "run1", "proxy", "ready", false],
      ["tk1", "run1", "task", "ready", false],
      ["wk1", "run1", "work", "ready", false],
    ]);
    const listed = await localBackend(agent.url, agentSecret).list();
    expect(listed.sort((a, b) => a.id.localeCompare(b.id))).toEqual([
      { id: "px1", runId: "run1", kind: "proxy" },
      { id: "tk1", runId: "run1", kind: "task" },
      { id: "wk1", runId: "run1", kind: "work" },
    ]);
    expect((await api.call("GET", "/v1/sandboxes?runId=run2")).body).toEqual({ sandboxes: [] });
  });

  it("close() removes every namespace, process, table and file it made", async () => {
    await agent.close();
    expect(await leftovers(UIDS)).toEqual([]);
    expect(readFileSync("/proc/sys/net/ipv4/ip_forward", "utf8").trim()).toBe(ipForwardBefore);
    expect(existsSync(join(stateDir, "sandboxes", "px1"))).toBe(false);
  });
});

describe.skipIf(whyNot !== null)("local agent: faults fail closed", () => {
  const FAULT_UIDS: [number, number] = [330_000, 330_400];
  const dirs: string[] = [];
  const tempDir = () => {
    const d = mkdtempSync(join(tmpdir(), "bw-agent-fault-"));
    dirs.push(d);
    return d;
  };
  beforeAll(() => ensureWorkImageBuilt(), 300_000);

  /** Runs `body` with agents it starts, then closes them (in the order started). */
  async function withAgents(
    body: (
      start: (o: {
        nft?: string;
        stateDir?: string;
        uidBase: number;
        workImage?: string;
      }) => Promise<AgentClient>,
    ) => Promise<void>,
  ) {
    const agents: RunningAgent[] = [];
    try {
      await body(async (o) => {
        const s = secret();
        const a = await startAgent({
          secret: s,
          port: 0,
          controlPlane: "http://127.0.0.1:9",
          nft: o.nft,
          workImage: o.workImage,
          stateDir: o.stateDir ?? tempDir(),
          uidBase: o.uidBase,
          log: () => {},
          proxyTestEnv: { BW_TEST_ALLOW_CIDRS: "10.240.0.0/30" },
        });
        agents.push(a);
        return new AgentClient(a.url, s);
      });
    } finally {
      for (const a of agents) await a.close();
    }
  }

  afterAll(async () => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
    expect(await leftovers(FAULT_UIDS)).toEqual([]);
  });

  it("refuses every sandbox with cannot_isolate when nftables is unusable", async () => {
    await withAgents(async (start) => {
      const api = await start({ nft: "/bin/false", uidBase: FAULT_UIDS[0] });
      const health = (await api.call("GET", "/v1/health")).body;
      expect(health.ok).toBe(false);
      expect(health.problems?.join("\n")).toMatch(/nftables is unusable/);
      const res = await api.call("POST", "/v1/sandboxes", { kind: "proxy", id: "p", runId: "r" });
      expect([res.status, res.body.code]).toEqual([503, "cannot_isolate"]);
      expect(res.body.detail).toMatch(/nftables is unusable/);
      expect(await leftovers(FAULT_UIDS)).toEqual([]);
    });
  });

  it("refuses every sandbox with cannot_isolate when the work image is not built", async () => {
    await withAgents(async (start) => {
      const api = await start({ workImage: "localhost/benchwright-no-such-image", uidBase: FAULT_UIDS[0] });
      const health = (await api.call("GET", "/v1/health")).body;
      expect(health).toEqual({
        ok: false,
        problems: ["the work image (localhost/benchwright-no-such-image) is not built: run npm run images"],
      });
      const res = await api.call("POST", "/v1/sandboxes", { kind: "proxy", id: "p", runId: "r" });
      expect([res.status, res.body.code]).toEqual([503, "cannot_isolate"]);
      expect(res.body.detail).toContain("run npm run images");
    });
  });

  it("exports the work image once per image id, and removes only exports no live agent uses", async () => {
    const root = tempDir();
    const [inUse, unused] = ["a", "b"].map((c) => c.repeat(64)) as [string, string];
    for (const id of [inUse, unused]) mkdirSync(join(root, id, "etc"), { recursive: true });
    writeFileSync(join(root, `.use-${inUse}-${process.pid}`), ""); // this process: alive
    writeFileSync(join(root, `.use-${unused}-999999999`), ""); // no such process
    const logged: Array<Record<string, unknown>> = [];
    const started = async () => {
      const s = secret();
      const a = await startAgent({
        secret: s,
        port: 0,
        controlPlane: "http://127.0.0.1:9",
        stateDir: tempDir(),
        rootfsDir: root,
        uidBase: FAULT_UIDS[0],
        log: (e) => logged.push(e),
      });
      await a.close();
    };
    await started();
    const exported = logged.filter((e) => e.event === "rootfs_exported");
    expect(exported).toHaveLength(1);
    const id = exported[0]?.imageId as string;
    expect(readdirSync(root).sort()).toEqual(
      [inUse, id, `.use-${inUse}-${process.pid}`, `.use-${id}-${process.pid}`].sort(),
    );
    // Files of the image's uid k belong to base+k; the export is root's only.
    expect(statSync(join(root, id, "etc", "hosts")).uid).toBe(ROOTFS_UID_BASE);
    expect(statSync(root).mode & 0o777).toBe(0o700);
    await started();
    expect(logged.filter((e) => e.event === "rootfs_exported")).toHaveLength(1); // cached
  }, 120_000);

  it("fails a catch-all sandbox whose redirect cannot be installed, leaving nothing of it (E2)", async () => {
    // Passes the health check and the proxy namespace's own rules; fails the catch-all rules.
    const nft = nftFailingCatchAll(tempDir());
    await withAgents(async (start) => {
      const api = await start({ nft, uidBase: FAULT_UIDS[0] });
      const px = await api.create({ kind: "proxy", id: "fp", runId: "fr" });
      const k = /^10\.231\.(\d+)\.2$/.exec(px.address)?.[1];
      const res = await api.call("POST", "/v1/sandboxes", {
        kind: "work",
        id: "fw",
        runId: "fr",
        proxySandboxId: "fp",
        routing: "catch-all",
      });
      expect([res.status, res.body.code]).toEqual([500, "sandbox_failed"]);
      expect(res.body.detail).toMatch(/^could not install the redirect: .*injected nft failure/);
      expect((await host(["ip", "netns", "list"])).stdout).not.toMatch(new RegExp(`^bw${k}w`, "m"));
      expect((await host(["ip", "-n", `bw${k}p`, "-br", "link"])).stdout).not.toContain(`bwp${k}w`);
      // The failed sandbox's uids (the block after the proxy's) run nothing.
      const processes = (await leftovers([FAULT_UIDS[0] + 2, FAULT_UIDS[0] + 4])).filter((l) =>
        l.startsWith("process"),
      );
      expect(processes).toEqual([]);
      const listed = (await api.call("GET", "/v1/sandboxes?runId=fr")).body.sandboxes;
      expect(listed?.map((s: SandboxInfo) => s.id)).toEqual(["fp"]);
      // Default routing needs no DNS redirect here, so the same agent still makes one.
      const ok = await api.create({
        kind: "work",
        id: "fd",
        runId: "fr",
        proxySandboxId: "fp",
        routing: "default",
      });
      expect(ok.state).toBe("ready");
    });
  });

  it("a new agent on the same state dir removes what a crashed one left", async () => {
    const stateDir = tempDir();
    await withAgents(async (start) => {
      const crashed = await start({ stateDir, uidBase: FAULT_UIDS[0] + 200 });
      const px = await crashed.create({ kind: "proxy", id: "cp", runId: "cr" });
      await crashed.serve("cp", "setInterval(() => {}, 1000); console.log('ready')");
      const k = /^10\.231\.(\d+)\.2$/.exec(px.address)?.[1];
      expect((await host(["ip", "netns", "list"])).stdout).toContain(`bw${k}p`);
      // The first agent never closes before the next one starts, as after a crash.
      await start({ stateDir, uidBase: FAULT_UIDS[0] + 300 });
      expect((await host(["ip", "netns", "list"])).stdout).not.toContain(`bw${k}p`);
      expect(await leftovers([FAULT_UIDS[0] + 200, FAULT_UIDS[0] + 300])).toEqual([]);
    });
  });
});
