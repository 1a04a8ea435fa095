import "reflect-metadata";
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import {
  createServer as createHttpServer,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from "node:http";
import { createServer as createHttpsServer, type Server as HttpsServer } from "node:https";
import { type AddressInfo, isIPv4, isIPv6, type Server as NetServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { ModelLaneSpec } from "@benchwright/shared/contract/policy";
import type { ModelCallRow } from "@benchwright/shared/contract/proxy-wire";
import { createAddressPolicy } from "@benchwright/shared/node/address-policy";
import {
  buildPolicyIndex,
  compilePolicy,
  type RunOptions,
  type VaultSnapshot,
} from "@benchwright/shared/policy/compile";
import { createRunCa, type RunCa } from "../../proxy-image/src/proxy/ca";
import {
  type AuditSink,
  createProxy,
  type DecisionRecord,
  type PolicyState,
  type ProxyOptions,
} from "../../proxy-image/src/proxy/handler";
import { createUpstream, type UpstreamOptions } from "../../proxy-image/src/proxy/upstream";
import type { TestCa } from "../../scripts/lib/test-ca";

export { createTestCa, selfSignedCert, type TestCa } from "../../scripts/lib/test-ca";

// One harness for the proxy tests: a test CA and real TLS upstreams on loopback addresses the
// suite picks (127.0.0.2 and up), the real proxy on 127.0.0.1, and real clients (curl, undici).

export interface Seen {
  method: string;
  url: string;
  headers: Record<string, string | string[] | undefined>;
  body: string;
  /** Body length in bytes. */
  bytes: number;
}

export type Handler = (req: IncomingMessage, res: ServerResponse, body: string) => void;

/** Echoes the request as JSON: method, url, headers, body (an upstream that echoes, case B7). */
export const echo: Handler = (req, res, body) => {
  const out = JSON.stringify({ method: req.method, url: req.url, headers: req.headers, body });
  res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(out) });
  res.end(out);
};

export interface Upstream {
  address: string;
  port: number;
  /** Requests whose body arrived in full. */
  seen: Seen[];
  /** Everything that reached the upstream at all, complete or not: "saw nothing" means all zero. */
  counts: { connections: number; requests: number };
  server: HttpsServer | Server;
  close(): Promise<void>;
}

export async function startTlsUpstream(options: {
  ca: TestCa;
  hosts: string[];
  address?: string;
  /** A fixed port (default: any free one). */
  port?: number;
  handler?: Handler;
  /** Serve this certificate instead of one from `ca` (B3: self-signed, wrong CA, wrong name). */
  cert?: { certPem: string; keyPem: string };
}): Promise<Upstream> {
  const { certPem, keyPem } = options.cert ?? (await options.ca.issue(options.hosts));
  const seen: Seen[] = [];
  const counts = { connections: 0, requests: 0 };
  const server = createHttpsServer(
    { cert: certPem, key: keyPem },
    recording(seen, counts, options.handler ?? echo),
  );
  server.on("secureConnection", () => counts.connections++);
  return listening(server, seen, counts, options.address ?? "127.0.0.2", options.port ?? 0);
}

/** A plain-HTTP upstream (B3: the proxy must never hand it a credential in clear). */
export async function startPlainUpstream(
  options: { address?: string; port?: number; handler?: Handler } = {},
): Promise<Upstream> {
  const seen: Seen[] = [];
  const counts = { connections: 0, requests: 0 };
  const server = createHttpServer(recording(seen, counts, options.handler ?? echo));
  server.on("connection", () => counts.connections++);
  return listening(server, seen, counts, options.address ?? "127.0.0.2", options.port ?? 0);
}

function recording(seen: Seen[], counts: Upstream["counts"], handler: Handler) {
  return (req: IncomingMessage, res: ServerResponse) => {
    counts.requests++;
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const raw = Buffer.concat(chunks);
      const body = raw.toString("utf8");
      seen.push({
        method: req.method ?? "",
        url: req.url ?? "",
        headers: req.headers,
        body,
        bytes: raw.length,
      });
      handler(req, res, body);
    });
  };
}

async function listening(
  server: HttpsServer | Server,
  seen: Seen[],
  counts: Upstream["counts"],
  address: string,
  wantPort: number,
): Promise<Upstream> {
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(wantPort, address, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  return {
    address,
    port,
    seen,
    counts,
    server,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

export interface AuditRecorder extends AuditSink {
  blocked: string[];
  /** Hosts the user's egress agent refused (source local_agent). */
  agentBlocked: string[];
  routes: Array<[string, string]>;
  /** [host, secret name] of each run placeholder sent unswapped (N2). */
  strays: Array<[string, string]>;
  modelCalls: ModelCallRow[];
  /** Limit refusals as recorded: host, method, limit (never a path). */
  limitRefusals: Array<[string, string, string]>;
  accepting: boolean;
}

export function auditRecorder(): AuditRecorder {
  const rec: AuditRecorder = {
    blocked: [],
    agentBlocked: [],
    routes: [],
    strays: [],
    modelCalls: [],
    limitRefusals: [],
    accepting: true,
    recordBlocked: (host, source = "proxy") =>
      void (source === "proxy" ? rec.blocked : rec.agentBlocked).push(host),
    recordRoute: (host, route) => void rec.routes.push([host, route]),
    recordStrayPlaceholder: (host, secret) => void rec.strays.push([host, secret]),
    recordModelCall: (row) => void rec.modelCalls.push(row),
    recordLimitRefusal: (host, method, limit) => void rec.limitRefusals.push([host, method, limit]),
  };
  return rec;
}

export function staticPolicy(vault: VaultSnapshot, secrets: Record<string, string>, run?: RunOptions) {
  const first = compilePolicy(vault, run);
  let state: PolicyState = { kind: "ready", policy: first, secrets, index: buildPolicyIndex(first) };
  return {
    current: () => state,
    set(next: PolicyState) {
      state = next;
    },
    setVault(v: VaultSnapshot, s: Record<string, string>, r?: RunOptions) {
      const policy = compilePolicy(v, r ?? run);
      state = { kind: "ready", policy, secrets: s, index: buildPolicyIndex(policy) };
    },
  };
}

/** A dial the proxy asked its upstream for: the checked address, never a name (A13). */
export interface Dial {
  protocol: string;
  /** The name TLS is verified against (null for a spliced connection's raw dial: the client verifies). */
  host: string | null;
  address: string;
  port: number;
}

export interface RunningProxy {
  tlsPort: number;
  httpPort: number;
  explicitPort: number;
  /** The direct listeners (I4): connections "dialled by address", given `originalDst`. */
  directTlsPort: number;
  directHttpPort: number;
  caPem: string;
  caFile: string;
  audit: AuditRecorder;
  logs: Array<DecisionRecord | Record<string, unknown>>;
  /** Every upstream dial, in order. Anything outside 127.0.0.0/8 is refused before it is dialled. */
  dials: Dial[];
  policy: ReturnType<typeof staticPolicy>;
  proxy: ReturnType<typeof createProxy>;
  /**
   * The first log record from index `from` on that matches, as soon as the proxy writes it (a
   * spliced connection's record comes when the connection closes, after the client is done).
   */
  waitForLog(
    match: (r: DecisionRecord | Record<string, unknown>) => boolean,
    from?: number,
  ): Promise<LogRecord>;
  close(): Promise<void>;
}

type LogRecord = DecisionRecord | Record<string, unknown>;

export async function startProxy(options: {
  vault: VaultSnapshot;
  secrets?: Record<string, string>;
  routes?: Record<string, Upstream | { address: string; port: number }>;
  upstreamCa?: TestCa;
  testAllowCidrs?: string[];
  /** The proxy's own addresses for the address policy (A12). */
  ownAddresses?: string[];
  upstream?: Partial<UpstreamOptions>;
  limits?: ProxyOptions["limits"];
  /** Where a direct listener's connection was dialled (a stand-in for SO_ORIGINAL_DST). */
  originalDst?: ProxyOptions["originalDst"];
  splice?: boolean;
  /**
   * Port the proxy dials → port actually dialled (pooled and Upgrade dials alike), for names
   * resolved by `upstream.lookup` (routes replace the port already): the suite's upstreams listen on free ports, while plain http
   * leaves for port 80 only (case I6). The checked address is dialled unchanged.
   */
  dialPorts?: Record<number, number>;
  computeLane?: ProxyOptions["computeLane"];
  /** The run's declared model (in the policy document) and the lane that serves it. */
  model?: ModelLaneSpec;
  modelLane?: ProxyOptions["modelLane"];
  /** The run's placeholder nonce (N2). */
  placeholderNonce?: string;
  /** The run CA (default: one like the proxy's own, unconstrained, 6 h leaves). */
  ca?: RunCa;
}): Promise<RunningProxy> {
  const ca = options.ca ?? (await createRunCa({ runId: "run_test" }));
  const dir = mkdtempSync(join(tmpdir(), "bw-proxy-test-"));
  const caFile = join(dir, "run-ca.pem");
  writeFileSync(caFile, ca.certPem);
  const audit = auditRecorder();
  const logs: RunningProxy["logs"] = [];
  const waiters = new Set<{ match: (r: LogRecord) => boolean; resolve: (r: LogRecord) => void }>();
  const logged = (r: LogRecord) => {
    logs.push(r);
    for (const w of waiters) {
      if (!w.match(r)) continue;
      waiters.delete(w);
      w.resolve(r);
    }
  };
  const policy = staticPolicy(
    options.vault,
    options.secrets ?? {},
    options.model ? { egress: "direct", model: options.model } : undefined,
  );
  const routes = new Map(
    Object.entries(options.routes ?? {}).map(([h, u]) => [h, { address: u.address, port: u.port }] as const),
  );
  const upstream = createUpstream({
    addressPolicy: createAddressPolicy({
      allowCidrs: options.testAllowCidrs ?? ["127.0.0.2/31", "127.0.0.4/30"],
      ...(options.ownAddresses ? { ownAddresses: options.ownAddresses } : {}),
    }),
    extraCaPem: options.upstreamCa?.certPem,
    testRoutes: routes,
    // Tests never use real DNS: a name without a route and without a test resolver fails (E5 path).
    lookup: async (host) => {
      throw new Error(`no DNS in tests (${host})`);
    },
    ...options.upstream,
  });
  // Belt and braces for "loopback only, ever": whatever the proxy decides, the harness never lets
  // it dial outside 127.0.0.0/8, and it records every dial so tests can assert "nothing dialled".
  const dials: Dial[] = [];
  const guarded: typeof upstream = {
    ...upstream,
    poolFor(protocol, host, address, port) {
      if (!isLoopbackAddress(address)) throw new Error(`test harness: refusing to dial ${address}`);
      dials.push({ protocol, host, address, port });
      return upstream.poolFor(protocol, host, address, options.dialPorts?.[port] ?? port);
    },
    // A spliced connection's raw dial (I3): the checked address, recorded the same way.
    dialRaw(address, port) {
      if (!isLoopbackAddress(address)) throw new Error(`test harness: refusing to dial ${address}`);
      dials.push({ protocol: "splice:", host: null, address, port });
      return upstream.dialRaw(address, port);
    },
    // An Upgrade request's own connection (I2); null: through the egress tunnel, not recorded.
    dialOnce(protocol, host, address, port) {
      if (address !== null) {
        if (!isLoopbackAddress(address)) throw new Error(`test harness: refusing to dial ${address}`);
        dials.push({ protocol: `upgrade ${protocol}`, host, address, port });
      }
      return upstream.dialOnce(
        protocol,
        host,
        address,
        address === null ? port : (options.dialPorts?.[port] ?? port),
      );
    },
  };
  const proxy = createProxy({
    ca,
    policy,
    audit,
    upstream: guarded,
    log: logged,
    ...(options.limits ? { limits: options.limits } : {}),
    ...(options.originalDst ? { originalDst: options.originalDst } : {}),
    ...(options.splice === false ? { splice: false } : {}),
    ...(options.computeLane ? { computeLane: options.computeLane } : {}),
    ...(options.modelLane ? { modelLane: options.modelLane } : {}),
    ...(options.placeholderNonce ? { placeholderNonce: options.placeholderNonce } : {}),
  });
  const listen = (srv: NetServer) =>
    new Promise<number>((resolve) =>
      srv.listen(0, "127.0.0.1", () => resolve((srv.address() as AddressInfo).port)),
    );
  const [tlsPort, httpPort, explicitPort, directTlsPort, directHttpPort] = await Promise.all([
    listen(proxy.tls),
    listen(proxy.http),
    listen(proxy.explicit),
    listen(proxy.directTls),
    listen(proxy.directHttp),
  ]);
  return {
    tlsPort,
    httpPort,
    explicitPort,
    directTlsPort,
    directHttpPort,
    caPem: ca.certPem,
    caFile,
    audit,
    logs,
    dials,
    policy,
    proxy,
    waitForLog(match, from = 0) {
      const hit = logs.slice(from).find(match);
      if (hit) return Promise.resolve(hit);
      return new Promise((resolve) => waiters.add({ match, resolve }));
    },
    close: async () => {
      await proxy.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

function isLoopbackAddress(address: string): boolean {
  if (isIPv4(address)) return address.startsWith("127.");
  if (isIPv6(address)) return address === "::1" || /^::ffff:127\./i.test(address);
  return false;
}

export interface CurlResult {
  code: number;
  status: number;
  body: string;
  stderr: string;
}

/** Runs the real curl; `--fail` is not used so the status is always reported. */
export function curl(args: string[]): Promise<CurlResult> {
  return new Promise((resolve) => {
    execFile(
      "curl",
      ["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}", ...args],
      { encoding: "utf8" },
      (err, stdout, stderr) => {
        const cut = stdout.lastIndexOf("\n");
        resolve({
          code: err ? ((err as { code?: number }).code ?? 1) : 0,
          status: Number(stdout.slice(cut + 1)),
          body: stdout.slice(0, cut),
          stderr,
        });
      },
    );
  });
}

/** curl arguments that reach `host`:443 through the proxy's transparent TLS listener, trusting the run CA. */
export function tlsArgs(proxy: { caFile: string; tlsPort: number }, host: string): string[] {
  return ["--cacert", proxy.caFile, "--connect-to", `${host}:443:127.0.0.1:${proxy.tlsPort}`];
}

/** curl to an https URL through the proxy's transparent TLS listener, as a sandbox would reach it. */
export function curlTls(
  proxy: { caFile: string; tlsPort: number },
  url: string,
  extra: readonly string[] = [],
): ReturnType<typeof curl> {
  return curl([...extra, ...tlsArgs(proxy, new URL(url).hostname), url]);
}

/** A vault snapshot from a short description (patterns must already be canonical). */
export function vault(v: Partial<VaultSnapshot>): VaultSnapshot {
  return { version: 1, default: "allow", hosts: [], rules: [], ...v };
}
