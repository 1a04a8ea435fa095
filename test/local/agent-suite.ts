import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { SandboxInfo } from "@benchwright/shared/contract/local-agent";
import {
  type AgentClient,
  ensureWorkImageBuilt,
  secret,
  startTestAgent,
  type TestAgent,
  whyNotRunnable,
} from "./harness";

// What the agent-*.test.ts files share: the local backend's host agent against real namespaces,
// nftables and processes. Needs root on Linux (CI runs as root); elsewhere the namespace suites
// are skipped and say why. Each file of "local agent: sandboxes in namespaces" starts its own
// agent with the same three sandboxes (startAgentSuite), so that each can run alone.

export const whyNot = whyNotRunnable();
if (whyNot)
  console.warn(`local agent suites skipped: ${whyNot} (they need root on Linux with ip, nft, unshare)`);

export const UIDS: [number, number] = [320_000, 320_400];

/** The `ps` state letter (R, S, T...) of the sandbox process whose command line has `marker`. */
export async function stateOf(
  api: AgentClient,
  sandboxId: string,
  marker: string,
): Promise<string | undefined> {
  const ps = await api.sh(sandboxId, "ps -eo stat=,args=", "setup");
  const line = ps.stdout.split("\n").find((l) => l.includes(marker) && !l.includes("ps -eo"));
  return line?.trim()[0];
}

/** One agent of the suite, its run1 sandboxes, and what it was started with. */
export interface AgentSuite extends TestAgent {
  stateDir: string;
  /** The host's ip_forward before the agent started (close() restores it). */
  ipForwardBefore: string;
  /** Every event the agent logged, a JSON line each. */
  logs: string[];
  agentSecret: string;
  proxy: SandboxInfo;
  /** Default routing. */
  work: SandboxInfo;
  catchAll: SandboxInfo;
  /** The agent, the upstream and the control plane closed; the state directory removed. */
  close(): Promise<void>;
}

/**
 * An agent with run1's proxy sandbox px1 (stand-ins for the proxy's listeners in it), the
 * default-routing work sandbox wk1 and the catch-all task sandbox tk1; on a failure, what was
 * started is stopped again.
 */
export async function startAgentSuite(): Promise<AgentSuite> {
  await ensureWorkImageBuilt();
  const ipForwardBefore = readFileSync("/proc/sys/net/ipv4/ip_forward", "utf8").trim();
  const stateDir = mkdtempSync(join(tmpdir(), "bw-agent-test-"));
  const logs: string[] = [];
  const agentSecret = secret();
  let started: TestAgent | undefined;
  const close = async () => {
    await started?.close();
    rmSync(stateDir, { recursive: true, force: true });
  };
  try {
    started = await startTestAgent({
      secret: agentSecret,
      stateDir,
      uidBase: UIDS[0],
      log: (event) => logs.push(JSON.stringify(event)),
    });
    const { api } = started;
    const proxy = await api.create({ kind: "proxy", id: "px1", runId: "run1" });
    const work = await api.create({
      kind: "work",
      id: "wk1",
      runId: "run1",
      proxySandboxId: "px1",
      routing: "default",
    });
    const catchAll = await api.create({
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
    return { ...started, stateDir, ipForwardBefore, logs, agentSecret, proxy, work, catchAll, close };
  } catch (error) {
    await close();
    throw error;
  }
}
