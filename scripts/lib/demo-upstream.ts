import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { join } from "node:path";
import { createTestCa } from "./test-ca";

// An upstream "internet" for the demo and the end-to-end tests: a network namespace of our own
// (veth to the host, addresses we assign in 10.240.0.0/16) running scripts/demo/upstream-server.mjs
// with a certificate from a throwaway test CA for every demo host. Nothing leaves the machine.

export interface DemoUpstream {
  /** The upstream's address (the hosts all resolve here for the proxy). */
  address: string;
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
}): Promise<DemoUpstream> {
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
  const leaf = await ca.issue(options.hosts);
  const httpsPort = 443;
  const directPort = 9000;
  const child: ChildProcess = spawn(
    "ip",
    ["netns", "exec", ns, process.execPath, join(import.meta.dirname, "..", "demo", "upstream-server.mjs")],
    { stdio: ["pipe", "pipe", "inherit"] },
  );
  const seen: Array<Record<string, unknown>> = [];
  const ready = new Promise<void>((resolve, reject) => {
    let buffer = "";
    child.stdout?.on("data", (d: Buffer) => {
      buffer += d.toString();
      let nl = buffer.indexOf("\n");
      while (nl >= 0) {
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + 1);
        if (line === "ready") resolve();
        else if (line.startsWith("{")) seen.push(JSON.parse(line));
        nl = buffer.indexOf("\n");
      }
    });
    child.once("exit", (code) => reject(new Error(`the demo upstream exited (${code})`)));
  });
  child.stdin?.end(
    JSON.stringify({
      certPem: leaf.certPem,
      keyPem: leaf.keyPem,
      expectedKey: options.expectedKey,
      httpsPort,
      directPort,
    }),
  );
  await ready;
  return {
    address,
    caPem: ca.certPem,
    httpsPort,
    directPort,
    cidr: `10.240.${options.index}.0/30`,
    seen,
    stop: async () => {
      child.kill("SIGKILL");
      removeNamespace(ns, hostSide);
    },
  };
}

function removeNamespace(ns: string, hostSide: string): void {
  try {
    ip("link", "del", hostSide);
  } catch {}
  try {
    ip("netns", "del", ns);
  } catch {}
}
