import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { join } from "node:path";
import type { StaticRoute } from "./pip-index";
import { createTestCa } from "./test-ca";

// An upstream "internet" for the demo and the end-to-end tests: a network namespace of our own
// (veth to the host, addresses we assign in 10.240.0.0/16) running scripts/demo/upstream-server.mjs
// with a certificate from a throwaway test CA for every demo host, and optionally static files
// (the example benchmark's pip index). Nothing leaves the machine.

export interface DemoUpstream {
  /** The upstream's address (the hosts all resolve here for the proxy). */
  address: string;
  /** Every host its certificate names (the proxy routes each here). */
  hosts: string[];
  /** The test CA that signed the upstream's certificate (the proxy trusts it, test-only). */
  caPem: string;
  httpsPort: number;
  directPort: number;
  /** CIDR the proxy must be allowed to reach (test-only setting). */
  cidr: string;
  /** Everything the upstream saw, in order. */
  seen: Array<Record<string, unknown>>;
  stop: () => Promise<void>;
}

const ip = (...args: string[]) => execFileSync("ip", args, { stdio: ["ignore", "ignore", "pipe"] });

export async function startDemoUpstream(options: {
  /** Namespace name (also names the veth pair): short, unique per suite. */
  name: string;
  /** 1-250: the third octet of its /30 in 10.240.0.0/16. */
  index: number;
  hosts: string[];
  /** The key a request is expected to carry (`Bearer <key>`); the upstream reports only whether it did. */
  expectedKey: string;
  /** Files served as they are (a pip index: scripts/lib/pip-index.ts); their hosts are served too. */
  static?: StaticRoute[];
}): Promise<DemoUpstream> {
  const hosts = [...new Set([...options.hosts, ...(options.static ?? []).map((r) => r.host)])];
  const ns = options.name;
  const hostSide = `${ns}h`.slice(0, 15);
  const nsSide = "eth0";
  const host = `10.240.${options.index}.1`;
  const address = `10.240.${options.index}.2`;
  removeNamespace(ns, hostSide);
  ip("netns", "add", ns);
  ip("link", "add", hostSide, "type", "veth", "peer", "name", `${hostSide}x`);
  ip("link", "set", `${hostSide}x`, "netns", ns);
  ip("-n", ns, "link", "set", `${hostSide}x`, "name", nsSide);
  ip("addr", "add", `${host}/30`, "dev", hostSide);
  ip("link", "set", hostSide, "up");
  ip("-n", ns, "addr", "add", `${address}/30`, "dev", nsSide);
  ip("-n", ns, "link", "set", nsSide, "up");
  ip("-n", ns, "link", "set", "lo", "up");
  ip("-n", ns, "route", "add", "default", "via", host);

  // Named per namespace: two upstreams' CAs with one name would be indistinguishable to a
  // verifier that holds both (it picks the first by subject, and the signature then fails).
  const ca = await createTestCa(`Benchwright demo upstream CA (${ns})`);
  const leaf = await ca.issue(hosts);
  let server: UpstreamServer;
  try {
    server = await runUpstreamServer(["ip", "netns", "exec", ns], {
      ...leaf,
      expectedKey: options.expectedKey,
      httpsPort: 443,
      directPort: 9000,
      static: options.static,
    });
  } catch (error) {
    removeNamespace(ns, hostSide);
    throw error;
  }
  return {
    address,
    hosts,
    caPem: ca.certPem,
    httpsPort: server.httpsPort,
    directPort: server.directPort,
    cidr: `10.240.${options.index}.0/30`,
    seen: server.seen,
    stop: async () => {
      server.kill();
      removeNamespace(ns, hostSide);
    },
  };
}

interface UpstreamServer {
  httpsPort: number;
  directPort: number;
  seen: Array<Record<string, unknown>>;
  kill: () => void;
}

/** scripts/demo/upstream-server.mjs under `prefix` (the namespace's `ip netns exec`, or nothing). */
async function runUpstreamServer(
  prefix: string[],
  config: {
    certPem: string;
    keyPem: string;
    expectedKey: string;
    httpsPort: number;
    directPort: number;
    bind?: string;
    static?: StaticRoute[];
  },
): Promise<UpstreamServer> {
  const argv = [...prefix, process.execPath, join(import.meta.dirname, "..", "demo", "upstream-server.mjs")];
  const child: ChildProcess = spawn(argv[0] as string, argv.slice(1), { stdio: ["pipe", "pipe", "inherit"] });
  const seen: Array<Record<string, unknown>> = [];
  let ports = { httpsPort: config.httpsPort, directPort: config.directPort };
  const ready = new Promise<void>((resolve, reject) => {
    let buffer = "";
    child.stdout?.on("data", (d: Buffer) => {
      buffer += d.toString();
      let nl = buffer.indexOf("\n");
      while (nl >= 0) {
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + 1);
        if (line === "ready") resolve();
        else if (line.startsWith("{")) {
          const event = JSON.parse(line);
          if (event.event === "listening")
            ports = { httpsPort: event.httpsPort, directPort: event.directPort };
          else seen.push(event);
        }
        nl = buffer.indexOf("\n");
      }
    });
    child.once("exit", (code) => reject(new Error(`the demo upstream exited (${code})`)));
  });
  child.stdin?.end(JSON.stringify(config));
  await ready;
  return { ...ports, seen, kill: () => child.kill("SIGKILL") };
}

/**
 * The same server on loopback, without a namespace (unit tests: a client on this machine, no
 * proxy): a certificate for `hosts` and 127.0.0.1 from a CA of its own, ports chosen by the kernel.
 */
export async function startLoopbackUpstream(options: {
  hosts: string[];
  expectedKey: string;
  static?: StaticRoute[];
}): Promise<{ caPem: string; httpsPort: number; seen: Array<Record<string, unknown>>; stop: () => void }> {
  const ca = await createTestCa("Benchwright loopback upstream CA");
  const leaf = await ca.issue([...options.hosts, "127.0.0.1"]);
  const server = await runUpstreamServer([], {
    ...leaf,
    expectedKey: options.expectedKey,
    httpsPort: 0,
    directPort: 0,
    bind: "127.0.0.1",
    static: options.static,
  });
  return { caPem: ca.certPem, httpsPort: server.httpsPort, seen: server.seen, stop: server.kill };
}

function removeNamespace(ns: string, hostSide: string): void {
  try {
    ip("link", "del", hostSide);
  } catch {}
  try {
    ip("netns", "del", ns);
  } catch {}
}
