import { type ChildProcess, fork, spawn } from "node:child_process";
import { closeSync, openSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { FakeControlPlane } from "../../test/proxy/control-plane";
import { createTestCa, type TestCa } from "../../test/proxy/harness";

// The processes the proxy benches start: the TLS upstream (lib/upstream-server.ts, forked) and the
// proxy bundle, configured as in its sandbox but on loopback, reporting ready to a FakeControlPlane.

export const HOST = "api.test";
export const UPSTREAM_ADDRESS = "127.0.0.2";
export const HEADER = "x-api-key";

/** `p`, unless `child` exits first or `ms` pass. */
export function waitExitOr<T>(child: ChildProcess, what: string, p: Promise<T>, ms: number): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
    child.once("exit", (code) => reject(new Error(`${what}: exited with ${code}`)));
    p.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e: unknown) => {
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}

export interface UpstreamCounts {
  requests: number;
  injected: number;
  connections: number;
}

export interface BenchUpstream {
  child: ChildProcess;
  port: number;
  ca: TestCa;
  /** The test CA's certificate, as a file (the proxy's BW_TEST_EXTRA_CA_FILE). */
  caFile: string;
  counts(): Promise<UpstreamCounts>;
}

/** api.test on 127.0.0.2, certificate from a test CA, in its own process. */
export async function startUpstream(o: {
  dir: string;
  bodyBytes: number;
  secret: string;
  children: ChildProcess[];
}): Promise<BenchUpstream> {
  const ca = await createTestCa("Benchwright bench upstream CA");
  const caFile = join(o.dir, "upstream-ca.pem");
  writeFileSync(caFile, ca.certPem);
  const leaf = await ca.issue([HOST]);
  const child = fork(fileURLToPath(new URL("./upstream-server.ts", import.meta.url)), [], {
    execArgv: ["--import", "tsx"],
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  o.children.push(child);
  child.send({
    kind: "start",
    certPem: leaf.certPem,
    keyPem: leaf.keyPem,
    address: UPSTREAM_ADDRESS,
    bodyBytes: o.bodyBytes,
    secret: o.secret,
    header: HEADER,
  });
  const port = await waitExitOr(
    child,
    "upstream",
    new Promise<number>((resolve) => {
      child.on("message", (m: { kind: string; port?: number }) => {
        if (m.kind === "listening") resolve(m.port as number);
      });
    }),
    20_000,
  );
  let countsId = 0;
  const counts = () =>
    new Promise<UpstreamCounts>((resolve) => {
      const id = ++countsId;
      const on = (m: UpstreamCounts & { kind: string; id: number }) => {
        if (m.kind !== "counts" || m.id !== id) return;
        child.off("message", on);
        resolve({ requests: m.requests, injected: m.injected, connections: m.connections });
      };
      child.on("message", on);
      child.send({ kind: "counts", id });
    });
  return { child, port, ca, caFile, counts };
}

/** The proxy bundle in its own process, routed to the bench upstream; resolves once it is ready. */
export async function startProxyProcess(o: {
  bundle: string;
  dir: string;
  cp: FakeControlPlane;
  upstream: BenchUpstream;
  logFile: string;
  nodeArgs?: string[];
  children: ChildProcess[];
}) {
  const logFd = openSync(o.logFile, "w");
  const readyCall = o.cp.nextReady();
  const child = spawn(process.execPath, [...(o.nodeArgs ?? []), o.bundle], {
    cwd: o.dir,
    stdio: ["ignore", logFd, logFd],
    env: {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      ...o.cp.proxyEnv(join(o.dir, `spool-${o.children.length}`)),
      BW_TEST_EXTRA_CA_FILE: o.upstream.caFile,
      BW_TEST_ROUTES: `${HOST}=${UPSTREAM_ADDRESS}:${o.upstream.port}`,
      BW_TEST_ALLOW_CIDRS: `${UPSTREAM_ADDRESS}/32`,
    },
  });
  closeSync(logFd);
  o.children.push(child);
  const ready = await waitExitOr(child, "proxy", readyCall, 30_000);
  return { child, pid: child.pid as number, ready };
}

/** The minimal MITM bundle (lib/minimal-mitm.ts) in its own process, with its own CA and leaf. */
export async function startMinimalMitm(o: {
  bundle: string;
  upstream: BenchUpstream;
  secret: string;
  nodeArgs?: string[];
  children: ChildProcess[];
}) {
  // A run CA's shape: ECDSA P-256, the leaf served with the CA.
  const ca = await createTestCa("Benchwright bench minimal MITM CA");
  const leaf = await ca.issue([HOST]);
  const child = fork(o.bundle, [], {
    execArgv: o.nodeArgs ?? [],
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  o.children.push(child);
  const port = await waitExitOr(
    child,
    "minimal MITM",
    new Promise<number>((resolve) => {
      child.on("message", (m: { kind: string; port?: number }) => {
        if (m.kind === "listening") resolve(m.port as number);
      });
      child.send({
        kind: "start",
        certPem: `${leaf.certPem}${ca.certPem}`,
        keyPem: leaf.keyPem,
        upstream: {
          address: UPSTREAM_ADDRESS,
          port: o.upstream.port,
          servername: HOST,
          caPem: o.upstream.ca.certPem,
        },
        header: HEADER,
        secret: o.secret,
      });
    }),
    20_000,
  );
  return { child, pid: child.pid as number, port, caPem: ca.certPem };
}
