import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
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
import { exchange, type RawTarget, wire } from "./raw";

// Case F3: mutated HTTP/1 messages, split at random chunk boundaries, never crash the proxy and
// are never forwarded in a shape a strict parser would not see. The oracle is differential: the
// same bytes, split the same way, go to a plain strict Node server (the reference); every
// request the upstream receives through the proxy must be one the reference saw (same method,
// target and body), so no message can be framed one way by the proxy and another way upstream.
// Seeded, so a failure replays: FUZZ_SEED=<n> npx vitest run --project unit test/proxy/fuzz.test.ts

const SEED = Number(process.env.FUZZ_SEED ?? 0x5eed_b0d7);
const CASES_PLAIN = 200;
const CASES_TLS = 100;
const BATCH = 10;
const CANARY = "sk-canary-fuzz-0c4f2e19ab";

/** mulberry32: small, seedable, good enough to pick mutations. */
function prng(seed: number) {
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
type Rng = ReturnType<typeof prng>;

const SMUGGLED = "GET /SMUGGLED HTTP/1.1\r\nHost: fuzz.test\r\n\r\n";
// (On the TLS path the smuggled request names fuzz.test inside a connection for fuzz-tls.test:
// if it is ever parsed as a request, it must be refused with 421, never forwarded.)

function templates(id: number, host: string): string[] {
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

function mutate(input: string, rng: Rng): string {
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
function split(s: string, rng: Rng): string[] {
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

interface Req {
  method: string;
  url: string;
  body: string;
}
const key = (r: Req) => JSON.stringify([r.method, r.url, r.body]);

let proxy: RunningProxy;
let plainUp: Upstream;
let tlsUp: Upstream;
let reference: Server;
let referencePort: number;
const referenceSeen: Req[] = [];

beforeAll(async () => {
  const ca = await createTestCa();
  plainUp = await startPlainUpstream({ address: "127.0.0.5" });
  tlsUp = await startTlsUpstream({ ca, hosts: ["fuzz-tls.test"], address: "127.0.0.4" });
  // The TLS path's host carries a rule, so injection and scrubbing are fuzzed too.
  proxy = await startProxy({
    vault: vault({
      hosts: [
        { pattern: "fuzz.test", action: "allow" },
        { pattern: "evil.test", action: "block" },
      ],
      rules: [{ host: "fuzz-tls.test", secret: "KEY", inject: { scheme: "bearer", name: "authorization" } }],
    }),
    secrets: { KEY: CANARY },
    routes: { "fuzz.test": plainUp, "fuzz-tls.test": tlsUp },
    upstreamCa: ca,
  });
  reference = createServer({ insecureHTTPParser: false }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      referenceSeen.push({
        method: req.method ?? "",
        url: req.url ?? "",
        body: Buffer.concat(chunks).toString("utf8"),
      });
      res.end("ok");
    });
  });
  reference.on("clientError", (_e, socket) => socket.destroy());
  await new Promise<void>((r) => reference.listen(0, "127.0.0.1", r));
  referencePort = (reference.address() as AddressInfo).port;
});

afterAll(async () => {
  await proxy.close();
  await Promise.all([plainUp.close(), tlsUp.close(), new Promise((r) => reference.close(r))]);
});

async function liveness(): Promise<void> {
  const r = await exchange({ port: proxy.httpPort }, [
    wire("GET /alive HTTP/1.1", ["Host: fuzz.test", "Connection: close"]),
  ]);
  expect(r.responses[0]?.status, "the proxy still answers a good request").toBe(200);
}

function checkSeen(seen: readonly Seen[], host: string, where: string): void {
  const available = new Map<string, number>();
  for (const r of referenceSeen) available.set(key(r), (available.get(key(r)) ?? 0) + 1);
  for (const s of seen) {
    if (s.url === "/alive") continue;
    // Well-formed as forwarded: the test host, a body exactly as long as declared.
    expect(s.headers.host, where).toBe(host);
    if (s.headers["content-length"] !== undefined)
      expect(s.bytes, where).toBe(Number(s.headers["content-length"]));
    for (const v of Object.values(s.headers).flat()) expect(v ?? "", where).not.toMatch(/[\r\n\0]/);
    // And something the strict reference parsed from the same bytes.
    const k = key({ method: s.method, url: s.url, body: s.body });
    const left = available.get(k) ?? 0;
    expect(left, `${where}: upstream saw ${k}, which the strict reference never parsed`).toBeGreaterThan(0);
    available.set(k, left - 1);
  }
}

describe(`case F3: mutated HTTP/1 messages (seed ${SEED})`, () => {
  it(`${CASES_PLAIN} cases on the plain listener and ${CASES_TLS} over TLS`, {
    timeout: 45_000,
  }, async () => {
    const rng = prng(SEED);
    let refused = 0;
    let forwarded = 0;
    const run = async (id: number, overTls: boolean) => {
      const message = mutate(rng.pick(templates(id, overTls ? "fuzz-tls.test" : "fuzz.test")), rng);
      const chunks = split(message, rng);
      const target: RawTarget = overTls
        ? { port: proxy.tlsPort, tls: { servername: "fuzz-tls.test", ca: proxy.caPem } }
        : { port: proxy.httpPort };
      // No half-close: Node's server ends a half-closed connection at once, answered or not.
      const options = { gapMs: 1, idleMs: 150, timeoutMs: 2_000 };
      const [viaProxy] = await Promise.all([
        exchange(target, chunks, options),
        exchange({ port: referencePort }, chunks, options),
      ]);
      expect(viaProxy.bytes.toString("latin1"), `case ${id}`).not.toContain(CANARY);
      for (const r of viaProxy.responses) {
        if (r.status >= 400) refused++;
        else forwarded++;
      }
    };
    const total = CASES_PLAIN + CASES_TLS;
    for (let start = 0; start < total; start += BATCH) {
      const batch: Array<Promise<void>> = [];
      for (let id = start; id < Math.min(total, start + BATCH); id++) batch.push(run(id, id >= CASES_PLAIN));
      await Promise.all(batch);
      if (start % 100 === 0) await liveness();
    }
    await liveness();
    // Let responses that were cut off settle upstream before comparing.
    await new Promise((r) => setTimeout(r, 100));
    checkSeen(plainUp.seen, "fuzz.test", "plain upstream");
    checkSeen(tlsUp.seen, "fuzz-tls.test", "TLS upstream");
    expect(tlsUp.seen.every((x) => x.headers.authorization === `Bearer ${CANARY}`)).toBe(true);
    // The fuzz must exercise both ways, or it proves nothing.
    expect(refused).toBeGreaterThan(30);
    expect(forwarded).toBeGreaterThan(30);
    expect(plainUp.seen.some((s) => s.url === "/SMUGGLED")).toBe(true); // the client's own pipelined request
  });
});
