import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { connect, createServer } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

// mitmdump (Debian's `mitmproxy`) as the reference TLS-terminating, header-injecting proxy:
// reverse mode to the bench upstream (which sets the upstream SNI to the mode's host; with
// keep_host_header it would not, and verification would be against the dialled IP instead), the
// upstream certificate verified against the bench's test CA,
// the injection done by bench/mitm_inject.py. Optional: absent, the bench says so and skips it.

const ADDON = fileURLToPath(new URL("../mitm_inject.py", import.meta.url));

/** `mitmdump --version`'s first line, or null when mitmdump is not installed. */
export function mitmdumpVersion(): string | null {
  const r = spawnSync("mitmdump", ["--version"], { encoding: "utf8", timeout: 20_000 });
  if (r.error || r.status !== 0) return null;
  return /Mitmproxy:\s*(\S+)/.exec(r.stdout)?.[1] ?? r.stdout.split("\n")[0]?.trim() ?? "unknown";
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

function accepting(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const c = connect(port, "127.0.0.1");
    c.once("connect", () => {
      c.destroy();
      resolve(true);
    });
    c.once("error", () => resolve(false));
  });
}

export interface Mitmdump {
  child: ChildProcess;
  port: number;
  pid: number;
  caPem: string;
  stop(): Promise<void>;
}

export async function startMitmdump(o: {
  dir: string;
  servername: string;
  upstream: { address: string; port: number };
  upstreamCaFile: string;
  header: string;
  secret: string;
}): Promise<Mitmdump> {
  const port = await freePort();
  const confdir = join(o.dir, "mitmproxy");
  const child: ChildProcess = spawn(
    "mitmdump",
    [
      "-q",
      "--mode",
      `reverse:https://${o.servername}:${o.upstream.port}`,
      "--listen-host",
      "127.0.0.1",
      "--listen-port",
      String(port),
      "--set",
      `confdir=${confdir}`,
      "--set",
      "ssl_insecure=false",
      "--set",
      `ssl_verify_upstream_trusted_ca=${o.upstreamCaFile}`,
      "--set",
      "http2=false",
      "-s",
      ADDON,
    ],
    {
      stdio: ["ignore", "ignore", "pipe"],
      env: {
        PATH: process.env.PATH ?? "/usr/bin:/bin",
        HOME: o.dir,
        PYTHONDONTWRITEBYTECODE: "1", // no __pycache__ beside the addon in the repo
        BENCH_UPSTREAM_ADDRESS: o.upstream.address,
        BENCH_UPSTREAM_PORT: String(o.upstream.port),
        BENCH_HEADER: o.header,
        BENCH_SECRET: o.secret,
      },
    },
  );
  let stderr = "";
  child.stderr?.on("data", (c: Buffer) => {
    if (stderr.length < 4096) stderr += c.toString("utf8");
  });
  let exited = false;
  child.once("exit", () => {
    exited = true;
  });
  const deadline = Date.now() + 30_000;
  while (!(await accepting(port))) {
    if (exited) throw new Error(`mitmdump exited at start: ${stderr.trim().slice(0, 500)}`);
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error("mitmdump did not start listening within 30 s");
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    child,
    port,
    pid: child.pid as number,
    caPem: readFileSync(join(confdir, "mitmproxy-ca-cert.pem"), "utf8"),
    stop: () => stopChild(child),
  };
}

/** SIGTERM, then SIGKILL after 5 s: for the bench's own children only. */
export function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
    child.once("exit", () => {
      clearTimeout(timer);
      resolve();
    });
    child.kill("SIGTERM");
  });
}
