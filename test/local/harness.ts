import { type ChildProcess, execFile, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { promisify } from "node:util";
import {
  ExecInfo,
  type ExecRequest,
  type ListedSandbox,
  SandboxInfo,
} from "@benchwright/shared/contract/local-agent";
import { detectCgroups } from "../../local-agent/cgroups";
import type { AgentLog } from "../../local-agent/registry-options";
import { type RunningAgent, startAgent } from "../../local-agent/server";
import { ensureWorkImage } from "../../scripts/lib/images";

// One harness for the local agent's tests: a client for the agent's API, helpers that run code
// in a sandbox, a test upstream in a namespace the suite makes itself, and the checks that
// prove nothing was left behind. Traffic goes only to loopback and namespaces the suite made.

const execFileP = promisify(execFile);
const PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

export { onPath, whyNotRunnable } from "../../scripts/lib/can-isolate";

let workImage: Promise<void> | null = null;
/**
 * The work image built (from the layer cache in seconds when unchanged), once per test file:
 * the agent exports it as every sandbox's root filesystem when it starts.
 */
export function ensureWorkImageBuilt(): Promise<void> {
  workImage ??= ensureWorkImage().then((why) => {
    if (why) throw new Error(`no work image for the sandboxes: ${why}`);
  });
  return workImage;
}

/** Runs a host command; resolves with its output whether it fails or not. */
export async function host(argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await execFileP(argv[0] as string, argv.slice(1), { env: { PATH } });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof e.code === "number" ? e.code : 1, stdout: e.stdout ?? "", stderr: e.stderr ?? "" };
  }
}

/** An agent answer: a contract body or a problem (fields the tests read). */
export interface Reply {
  status: number;
  body: {
    code?: string;
    detail?: string;
    execId?: string;
    state?: string;
    ok?: boolean;
    problems?: string[];
    sandboxes?: ListedSandbox[];
  } & Record<string, unknown>;
}

export const secret = () => randomBytes(24).toString("hex");

/**
 * Writes `dir/nft-fault`, an nft that fails exactly on the catch-all rules (those redirecting DNS)
 * and passes everything else to the real nft: the health check and the proxy namespace's own
 * rules pass, a catch-all redirect cannot be installed (case E2). Returns its path.
 */
export function nftFailingCatchAll(dir: string): string {
  const nft = join(dir, "nft-fault");
  writeFileSync(
    nft,
    `#!/bin/sh
input=$(cat)
case "$input" in *"th dport 53 dnat"*) echo "injected nft failure" >&2; exit 1 ;; esac
printf '%s\\n' "$input" | exec nft "$@"
`,
  );
  chmodSync(nft, 0o755);
  return nft;
}

export class AgentClient {
  constructor(
    readonly url: string,
    private readonly secret: string,
  ) {}

  async call(
    method: string,
    path: string,
    body?: unknown,
    auth: string | null = this.secret,
  ): Promise<Reply> {
    const res = await fetch(`${this.url}${path}`, {
      method,
      headers: {
        ...(auth === null ? {} : { authorization: `Bearer ${auth}` }),
        ...(body === undefined ? {} : { "content-type": "application/json" }),
      },
      body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
    });
    const text = await res.text();
    return { status: res.status, body: text ? JSON.parse(text) : null };
  }

  async create(request: Record<string, unknown>): Promise<SandboxInfo> {
    const { status, body } = await this.call("POST", "/v1/sandboxes", request);
    if (status !== 201 && status !== 200)
      throw new Error(`create ${request.id}: ${status} ${JSON.stringify(body)}`);
    return SandboxInfo.parse(body);
  }

  async start(sandboxId: string, request: ExecRequest): Promise<ExecInfo> {
    const { status, body } = await this.call("POST", `/v1/sandboxes/${sandboxId}/exec`, request);
    if (status !== 202 && status !== 200)
      throw new Error(`exec in ${sandboxId}: ${status} ${JSON.stringify(body)}`);
    return ExecInfo.parse(body);
  }

  async poll(sandboxId: string, execId: string, query = ""): Promise<ExecInfo> {
    const { status, body } = await this.call("GET", `/v1/sandboxes/${sandboxId}/exec/${execId}${query}`);
    if (status !== 200) throw new Error(`poll ${execId}: ${status} ${JSON.stringify(body)}`);
    return ExecInfo.parse(body);
  }

  /** Runs a command to its end (long-polling) and returns its ExecInfo. */
  async run(sandboxId: string, request: ExecRequest): Promise<ExecInfo> {
    const started = await this.start(sandboxId, request);
    let info = started;
    while (info.state === "running") info = await this.poll(sandboxId, started.execId, "?waitMs=30000");
    return info;
  }

  /** `sh -c script` in a sandbox. */
  sh(
    sandboxId: string,
    script: string,
    stage: "setup" | "execute" = "execute",
    env: Record<string, string> = {},
  ) {
    return this.run(sandboxId, { argv: ["sh", "-c", script], stage, env });
  }

  /**
   * Starts a long-running node program (`args` are its process.argv[1..]) and waits for its first
   * line of output ("ready").
   */
  async serve(
    sandboxId: string,
    code: string,
    stage: "setup" | "execute" = "setup",
    args: string[] = [],
  ): Promise<ExecInfo> {
    const started = await this.start(sandboxId, {
      argv: ["node", "-e", code, ...args],
      stage,
      timeoutMs: 120_000,
    });
    for (;;) {
      const info = await this.poll(sandboxId, started.execId, "?waitMs=200");
      if (info.stdout.includes("ready")) return info;
      if (info.state === "exited") throw new Error(`server in ${sandboxId} exited: ${info.stderr}`);
    }
  }

  /** Connects (TCP) or sends a datagram (UDP) to each target from inside a sandbox, in parallel. */
  async probe(
    sandboxId: string,
    targets: ProbeTarget[],
    stage: "setup" | "execute" = "execute",
  ): Promise<string[]> {
    const info = await this.run(sandboxId, { argv: ["node", "-e", PROBE, JSON.stringify(targets)], stage });
    if (info.exitCode !== 0) throw new Error(`probe failed: ${info.stderr}`);
    return JSON.parse(info.stdout) as string[];
  }
}

export type ProbeTarget = { host: string; port: number; udp?: string };

// TCP: the text the server sent before closing, "EOF" for an empty answer, "ERR <code>" or
// "TIMEOUT". UDP: "reply:<text>" or "noreply" (an unanswered datagram reports no error).
const PROBE = `
const net = require("net"), dgram = require("dgram");
const targets = JSON.parse(process.argv[1]);
Promise.all(targets.map((t) => new Promise((done) => {
  if (t.udp !== undefined) {
    const s = dgram.createSocket("udp4");
    const timer = setTimeout(() => { s.close(); done("noreply"); }, 1000);
    s.on("message", (m) => { clearTimeout(timer); s.close(); done("reply:" + m); });
    s.on("error", (e) => { clearTimeout(timer); s.close(); done("ERR " + e.code); });
    s.send(t.udp, t.port, t.host);
    return;
  }
  let data = "";
  const s = net.connect({ host: t.host, port: t.port });
  const timer = setTimeout(() => { s.destroy(); done("TIMEOUT"); }, 3000);
  s.on("data", (d) => { data += d; });
  s.on("end", () => { clearTimeout(timer); s.destroy(); done(data || "EOF"); });
  s.on("error", (e) => { clearTimeout(timer); done("ERR " + e.code); });
}))).then((r) => console.log(JSON.stringify(r)));
`;

/** What startControlPlane started: its URL, the paths it was asked, and how to stop it. */
export interface TestControlPlane {
  url: string;
  paths: string[];
  close(): Promise<void>;
}

/** A tiny control plane on loopback: answers `control-plane:<path>`, and keeps the paths asked. */
export async function startControlPlane(): Promise<TestControlPlane> {
  const paths: string[] = [];
  const server: Server = createServer((req, res) => {
    paths.push(req.url ?? "");
    res.end(`control-plane:${req.url}`);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    paths,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

/**
 * A test upstream in a namespace of the suite's own (`bwt-up1`, 10.240.0.2, default route via
 * the host at 10.240.0.1): TCP 443 and 9000 answer "upstream:<port>"; UDP 53, 443 and 9001 answer
 * "upstream-udp" and log each datagram as a line `udp:<port>:<text>`.
 */
export class TestUpstream {
  static readonly address = "10.240.0.2";
  private lines: string[] = [];
  private constructor(private readonly child: ChildProcess) {
    let buffer = "";
    child.stdout?.on("data", (d: Buffer) => {
      buffer += d.toString();
      const parts = buffer.split("\n");
      buffer = parts.pop() ?? "";
      this.lines.push(...parts);
    });
  }

  static async start(): Promise<TestUpstream> {
    await TestUpstream.remove();
    const steps = [
      ["ip", "netns", "add", "bwt-up1"],
      ["ip", "link", "add", "bwt-up1h", "type", "veth", "peer", "name", "eth0", "netns", "bwt-up1"],
      ["ip", "addr", "add", "10.240.0.1/30", "dev", "bwt-up1h"],
      ["ip", "link", "set", "bwt-up1h", "up"],
      ["ip", "-n", "bwt-up1", "addr", "add", "10.240.0.2/30", "dev", "eth0"],
      ["ip", "-n", "bwt-up1", "link", "set", "eth0", "up"],
      ["ip", "-n", "bwt-up1", "link", "set", "lo", "up"],
      ["ip", "-n", "bwt-up1", "route", "add", "default", "via", "10.240.0.1"],
    ];
    for (const step of steps) {
      const r = await host(step);
      if (r.code !== 0) throw new Error(`${step.join(" ")}: ${r.stderr}`);
    }
    const child = spawn("ip", ["netns", "exec", "bwt-up1", "node", "-e", UPSTREAM], {
      env: { PATH },
      stdio: ["ignore", "pipe", "inherit"],
    });
    const upstream = new TestUpstream(child);
    await upstream.waitFor((l) => l === "ready");
    return upstream;
  }

  /** Resolves when a line matching `match` has been logged (the suite's timeout bounds it). */
  async waitFor(match: (line: string) => boolean): Promise<void> {
    while (!this.lines.some(match)) await new Promise((r) => setTimeout(r, 20));
  }

  received(port: number, text: string): boolean {
    return this.lines.includes(`udp:${port}:${text}`);
  }

  async stop(): Promise<void> {
    this.child.kill("SIGKILL");
    await TestUpstream.remove();
  }

  static async remove(): Promise<void> {
    for (const pid of (await host(["ip", "netns", "pids", "bwt-up1"])).stdout.split(/\s+/).filter(Boolean)) {
      try {
        process.kill(Number(pid), "SIGKILL");
      } catch {}
    }
    await host(["ip", "link", "del", "bwt-up1h"]);
    await host(["ip", "netns", "del", "bwt-up1"]);
  }
}

const UPSTREAM = `
const net = require("net"), dgram = require("dgram");
for (const port of [443, 9000]) net.createServer((s) => s.end("upstream:" + port)).listen(port, "10.240.0.2");
for (const port of [53, 443, 9001]) {
  const u = dgram.createSocket("udp4");
  u.on("message", (m, from) => { console.log("udp:" + port + ":" + m); u.send("upstream-udp", from.port, from.address); });
  u.bind(port, "10.240.0.2");
}
setTimeout(() => console.log("ready"), 50);
`;

export { until } from "../until";

/** An agent of a suite's own, with the suite's control plane and test upstream (startTestAgent). */
export interface TestAgent {
  agent: RunningAgent;
  api: AgentClient;
  controlPlane: TestControlPlane;
  upstream: TestUpstream;
  /** The agent closed, then the upstream and the control plane. */
  close(): Promise<void>;
}

/**
 * The control plane, the test upstream and an agent relaying to that control plane, whose
 * sandboxes take uids from `uidBase`; on a failure, what was started is stopped again.
 */
export async function startTestAgent(o: {
  secret: string;
  stateDir: string;
  uidBase: number;
  log: AgentLog;
  /** Where the agent keeps setup layers (default: its own, which tests should not touch). */
  layersDir?: string;
}): Promise<TestAgent> {
  const controlPlane = await startControlPlane();
  let upstream: TestUpstream | undefined;
  try {
    upstream = await TestUpstream.start();
    const agent = await startAgent({
      secret: o.secret,
      port: 0,
      controlPlane: controlPlane.url,
      stateDir: o.stateDir,
      uidBase: o.uidBase,
      log: o.log,
      layersDir: o.layersDir ?? join(o.stateDir, "setup-layers"),
      // The suite's upstream is on a private address: direct traffic may reach it, as a test host.
      proxyTestEnv: { BW_TEST_ALLOW_CIDRS: "10.240.0.0/30" },
    });
    const started = upstream;
    return {
      agent,
      api: new AgentClient(agent.url, o.secret),
      controlPlane,
      upstream,
      close: async () => {
        await agent.close();
        await started.stop();
        await controlPlane.close();
      },
    };
  } catch (error) {
    await upstream?.stop();
    await controlPlane.close();
    throw error;
  }
}

/** What the agent made that still exists on this machine. */
export async function leftovers(uidRange: [number, number]): Promise<string[]> {
  const found: string[] = [];
  const netns = (await host(["ip", "netns", "list"])).stdout;
  for (const line of netns.split("\n")) {
    const name = line.split(" ")[0] ?? "";
    if (/^bw\d+(p|w\d+)$/.test(name)) found.push(`netns ${name}`);
  }
  for (const link of readdirSync("/sys/class/net")) if (/^bw(h|p)\d+/.test(link)) found.push(`link ${link}`);
  if ((await host(["nft", "list", "table", "inet", "benchwright_host"])).code === 0) {
    found.push("nft table benchwright_host");
  }
  for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
    try {
      const uid = Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1]);
      if (uid >= uidRange[0] && uid < uidRange[1]) found.push(`process ${pid} (uid ${uid})`);
    } catch {}
  }
  // Sandboxes' cgroups (the agent's parent directories may stay, empty) and user namespace files.
  const cgroups = detectCgroups();
  for (const parent of cgroups.ok ? Object.values(cgroups.host.parents) : []) {
    if (existsSync(parent)) {
      for (const e of readdirSync(parent, { withFileTypes: true })) {
        if (e.isDirectory()) found.push(`cgroup ${join(parent, e.name)}`);
      }
    }
  }
  for (const line of readFileSync("/proc/self/mountinfo", "utf8").split("\n")) {
    const point = line.split(" ")[4] ?? "";
    if (/\/sandboxes\/[^/]+\/userns$/.test(point)) found.push(`mount ${point}`);
  }
  return found;
}
