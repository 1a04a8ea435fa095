import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import {
  createTestCa,
  type RunningProxy,
  type Seen,
  startPlainUpstream,
  startProxy,
  startTlsUpstream,
  type Upstream,
  vault,
} from "./harness";
import { type ExchangeOptions, exchange, type RawTarget, wire } from "./raw";

// Case F3's fuzzer and its oracle, shared by the proxy test (test/proxy/fuzz.test.ts, a few
// hundred cases) and the fuzz bench (bench/fuzz-bench.ts, 100,000 and more): mutated HTTP/1
// messages, split at random chunk boundaries, go to the real proxy and, the same bytes split the
// same way, to a plain strict Node server (the reference). Every request the upstream receives
// through the proxy must be one the reference saw (same method, target and body), so no message
// can be framed one way by the proxy and another way upstream.

export const DEFAULT_SEED = 0x5eed_b0d7;
export const CANARY = "sk-canary-fuzz-0c4f2e19ab";
export const PLAIN_HOST = "fuzz.test";
export const TLS_HOST = "fuzz-tls.test";

/** mulberry32: small, seedable, good enough to pick mutations. */
export function prng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (n: number) => Math.floor(next() * n);
  const pick = <T>(xs: readonly T[]): T => xs[int(xs.length)] as T;
  return { next, int, pick };
}
export type Rng = ReturnType<typeof prng>;

export const SMUGGLED = "GET /SMUGGLED HTTP/1.1\r\nHost: fuzz.test\r\n\r\n";
// (On the TLS path the smuggled request names fuzz.test inside a connection for fuzz-tls.test:
// if it is ever parsed as a request, it must be refused with 421, never forwarded.)

export function templates(id: number, host: string): string[] {
  const h = [`Host: ${host}`, "X-A: b"];
  return [
    wire(`POST /cl?c=${id} HTTP/1.1`, [...h, `Content-Length: ${SMUGGLED.length}`], SMUGGLED),
    wire(
      `POST /te?c=${id} HTTP/1.1`,
      [...h, "Transfer-Encoding: chunked"],
      `${SMUGGLED.length.toString(16)}\r\n${SMUGGLED}\r\n0\r\n\r\n`,
    ),
    wire(`GET /one?c=${id} HTTP/1.1`, h) + wire(`GET /two?c=${id} HTTP/1.1`, h),
    wire(`POST /zero?c=${id} HTTP/1.1`, [...h, "Content-Length: 0"]) + SMUGGLED,
    wire(`POST /te0?c=${id} HTTP/1.1`, [...h, "Transfer-Encoding: chunked"], "0\r\n\r\n") + SMUGGLED,
  ];
}

const BYTES = [
  "\r",
  "\n",
  "\0",
  " ",
  "\t",
  ":",
  ",",
  ";",
  "0",
  "1",
  "9",
  "a",
  "f",
  "x",
  "-",
  "+",
  "\x7f",
  "\x01",
];
const INSERTS = [
  "\r\n",
  "\n",
  "\r\n ",
  "Transfer-Encoding: chunked\r\n",
  "Content-Length: 0\r\n",
  "Content-Length: 5\r\n",
  "Transfer-Encoding: identity\r\n",
  " chunked",
  ", chunked",
  "Host: evil.test\r\n",
  "Host: fuzz.test\r\n",
  "0\r\n\r\n",
  SMUGGLED,
];

export function mutate(input: string, rng: Rng): string {
  let s = input;
  const n = 1 + rng.int(3);
  for (let k = 0; k < n; k++) {
    const at = rng.int(s.length + 1);
    switch (rng.int(6)) {
      case 0: // replace one byte
        s = s.slice(0, at) + rng.pick(BYTES) + s.slice(at + 1);
        break;
      case 1: // insert one byte
        s = s.slice(0, at) + rng.pick(BYTES) + s.slice(at);
        break;
      case 2: // insert a fragment, preferably at a line start
        {
          const line = s.lastIndexOf("\r\n", at);
          const pos = rng.next() < 0.6 && line !== -1 ? line + 2 : at;
          s = s.slice(0, pos) + rng.pick(INSERTS) + s.slice(pos);
        }
        break;
      case 3: // delete a few bytes
        s = s.slice(0, at) + s.slice(at + 1 + rng.int(3));
        break;
      case 4: {
        // duplicate a header line
        const lines = s.split("\r\n");
        const i = 1 + rng.int(Math.max(1, lines.length - 2));
        lines.splice(i, 0, lines[i] ?? "");
        s = lines.join("\r\n");
        break;
      }
      default: {
        // a different Content-Length or chunk-size value
        const values = ["0", "4", "1000", "-1", "+44", " 44", "44 ", "0x2c", "2c", "044", "", "44, 44"];
        s = s.replace(/(Content-Length: )[^\r\n]*/i, `$1${rng.pick(values)}`);
        break;
      }
    }
  }
  return s;
}

/** Splits `s` into 1–5 chunks at random boundaries. */
export function split(s: string, rng: Rng): string[] {
  const cuts = [...new Set(Array.from({ length: rng.int(5) }, () => rng.int(s.length)))].sort(
    (a, b) => a - b,
  );
  const out: string[] = [];
  let prev = 0;
  for (const c of cuts) {
    if (c > prev) out.push(s.slice(prev, c));
    prev = c;
  }
  out.push(s.slice(prev));
  return out;
}

/** A request as a parser framed it: what must agree between the reference and the upstream. */
export interface Req {
  method: string;
  url: string;
  body: string;
}
export const requestKey = (r: Req) => JSON.stringify([r.method, r.url, r.body]);

// ---- the parts: the proxy with its two upstreams, and the reference ----

export interface FuzzProxy {
  proxy: RunningProxy;
  /** fuzz.test, plain HTTP on 127.0.0.5, reached through the proxy's plain listener. */
  plainUp: Upstream;
  /** fuzz-tls.test, HTTPS on 127.0.0.4, through the TLS listener; its host has an injection rule. */
  tlsUp: Upstream;
  close(): Promise<void>;
}

/** The real proxy (test/proxy/harness.ts) with the fuzz vault: an allowed, a blocked and an injected host. */
export async function startFuzzProxy(): Promise<FuzzProxy> {
  const ca = await createTestCa();
  const plainUp = await startPlainUpstream({ address: "127.0.0.5" });
  const tlsUp = await startTlsUpstream({ ca, hosts: [TLS_HOST], address: "127.0.0.4" });
  // The TLS path's host carries a rule, so injection and scrubbing are fuzzed too.
  const proxy = await startProxy({
    vault: vault({
      hosts: [
        { pattern: PLAIN_HOST, action: "allow" },
        { pattern: "evil.test", action: "block" },
      ],
      rules: [{ host: TLS_HOST, secret: "KEY", inject: { scheme: "bearer", name: "authorization" } }],
    }),
    secrets: { KEY: CANARY },
    routes: { [PLAIN_HOST]: plainUp, [TLS_HOST]: tlsUp },
    upstreamCa: ca,
  });
  return {
    proxy,
    plainUp,
    tlsUp,
    close: async () => {
      await proxy.close();
      await Promise.all([plainUp.close(), tlsUp.close()]);
    },
  };
}

export interface Reference {
  port: number;
  /** Every request it parsed in full; the caller may take them out (splice) as it checks. */
  seen: Req[];
  close(): Promise<void>;
}

/** The strict reference: Node's HTTP server with its strict parser, dropping whatever it refuses. */
export async function startReference(): Promise<Reference> {
  const seen: Req[] = [];
  const server = createServer({ insecureHTTPParser: false }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      seen.push({
        method: req.method ?? "",
        url: req.url ?? "",
        body: Buffer.concat(chunks).toString("utf8"),
      });
      res.end("ok");
    });
  });
  server.on("clientError", (_e, socket) => socket.destroy());
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    port: (server.address() as AddressInfo).port,
    seen,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

// ---- one case ----

/** Where the cases go: the proxy's plain and TLS listeners (and the CA it serves), and the reference. */
export interface FuzzTargets {
  httpPort: number;
  tlsPort: number;
  caPem: string;
  referencePort: number;
}

// No half-close: Node's server ends a half-closed connection at once, answered or not.
export const EXCHANGE: ExchangeOptions = { gapMs: 1, idleMs: 150, timeoutMs: 2_000 };

export interface CaseOutcome {
  /** The message, as the chunks it was sent in (for a replay). */
  chunks: string[];
  /** Responses the proxy sent: refusals (>= 400) and others. */
  refused: number;
  forwarded: number;
  /** The proxy's answer carried the injected secret. */
  leaked: boolean;
}

/**
 * Case `id`: a template mutated, split, sent to the proxy and to the reference at once. The
 * random choices are made before the first await, so cases started in id order draw the same
 * numbers from `rng` whatever their timing: a seed replays.
 */
export async function fuzzCase(
  targets: FuzzTargets,
  rng: Rng,
  id: number,
  overTls: boolean,
  options: ExchangeOptions = EXCHANGE,
): Promise<CaseOutcome> {
  const message = mutate(rng.pick(templates(id, overTls ? TLS_HOST : PLAIN_HOST)), rng);
  const chunks = split(message, rng);
  const target: RawTarget = overTls
    ? { port: targets.tlsPort, tls: { servername: TLS_HOST, ca: targets.caPem } }
    : { port: targets.httpPort };
  const [viaProxy] = await Promise.all([
    exchange(target, chunks, options),
    exchange({ port: targets.referencePort }, chunks, options),
  ]);
  let refused = 0;
  let forwarded = 0;
  for (const r of viaProxy.responses) {
    if (r.status >= 400) refused++;
    else forwarded++;
  }
  return { chunks, refused, forwarded, leaked: viaProxy.bytes.toString("latin1").includes(CANARY) };
}

export const LIVENESS_URL = "/alive";

/** The status the proxy's plain listener answers a well-formed request with (undefined: none). */
export async function liveness(httpPort: number): Promise<number | undefined> {
  const r = await exchange({ port: httpPort }, [
    wire(`GET ${LIVENESS_URL} HTTP/1.1`, [`Host: ${PLAIN_HOST}`, "Connection: close"]),
  ]);
  return r.responses[0]?.status;
}

// ---- the oracle ----

export interface Finding {
  where: string;
  problem: string;
  /** The forwarded request's method, target and body (JSON), when that is what is wrong. */
  key?: string;
}

/**
 * "Nothing ambiguous forwarded": every request an upstream received through the proxy must be
 * well-formed as forwarded (the test host, a body exactly as long as declared, no CR, LF or NUL
 * in a header value) and be one the strict reference parsed from the same bytes, each reference
 * request justifying at most one forward. It can be fed in portions: a forward the reference has
 * not (yet) been seen to parse is held and tried again, and only what is still unmatched at
 * settle() is a finding.
 */
export class ForwardOracle {
  private readonly available = new Map<string, number>();
  private held: Array<{ key: string; where: string }> = [];

  /** Requests the reference parsed. */
  reference(reqs: Iterable<Req>): void {
    for (const r of reqs) {
      const k = requestKey(r);
      this.available.set(k, (this.available.get(k) ?? 0) + 1);
    }
  }

  /** Requests `host`'s upstream received; returns the shape findings at once. */
  forwarded(seen: Iterable<Seen>, host: string, where: string): Finding[] {
    const findings: Finding[] = [];
    for (const s of seen) {
      if (s.url === LIVENESS_URL) continue;
      const key = requestKey({ method: s.method, url: s.url, body: s.body });
      // Well-formed as forwarded: the test host, a body exactly as long as declared.
      if (s.headers.host !== host)
        findings.push({ where, key, problem: `Host ${JSON.stringify(s.headers.host)}, not ${host}` });
      if (s.headers["content-length"] !== undefined && s.bytes !== Number(s.headers["content-length"]))
        findings.push({
          where,
          key,
          problem: `a ${s.bytes}-byte body under Content-Length ${s.headers["content-length"]}`,
        });
      for (const v of Object.values(s.headers).flat())
        if (/[\r\n\0]/.test(v ?? ""))
          findings.push({ where, key, problem: `a header value with CR, LF or NUL: ${JSON.stringify(v)}` });
      // And something the strict reference parsed from the same bytes.
      if (!this.take(key)) this.held.push({ key, where });
    }
    return findings;
  }

  /** Forwards still waiting for their reference request. */
  get pending(): number {
    return this.held.length;
  }

  /** Tries the held forwards again (after more reference requests came in). */
  retry(): void {
    this.held = this.held.filter((h) => !this.take(h.key));
  }

  /** The forwards no reference request accounts for, after a last retry. */
  settle(): Finding[] {
    this.retry();
    const out = this.held.map((h) => ({
      where: h.where,
      key: h.key,
      problem: `upstream saw ${h.key}, which the strict reference never parsed`,
    }));
    this.held = [];
    return out;
  }

  private take(key: string): boolean {
    const left = this.available.get(key) ?? 0;
    if (left === 0) return false;
    if (left === 1) this.available.delete(key);
    else this.available.set(key, left - 1);
    return true;
  }
}
