import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  CANARY,
  DEFAULT_SEED,
  ForwardOracle,
  type FuzzProxy,
  fuzzCase,
  liveness,
  PLAIN_HOST,
  prng,
  type Reference,
  startFuzzProxy,
  startReference,
  TLS_HOST,
} from "./fuzz-lib";

// Case F3: mutated HTTP/1 messages, split at random chunk boundaries, never crash the proxy and
// are never forwarded in a shape a strict parser would not see. The oracle is differential: the
// same bytes, split the same way, go to a plain strict Node server (the reference); every
// request the upstream receives through the proxy must be one the reference saw (same method,
// target and body), so no message can be framed one way by the proxy and another way upstream.
// The fuzzer and the oracle are in fuzz-lib.ts, shared with the fuzz bench (bench/fuzz-bench.ts,
// `npm run bench:fuzz`, 100,000 cases).
// Seeded, so a failure replays: FUZZ_SEED=<n> npx vitest run --project unit test/proxy/fuzz.test.ts

const SEED = Number(process.env.FUZZ_SEED ?? DEFAULT_SEED);
const CASES_PLAIN = 200;
const CASES_TLS = 100;
const BATCH = 10;

let fuzz: FuzzProxy;
let reference: Reference;

beforeAll(async () => {
  fuzz = await startFuzzProxy();
  reference = await startReference();
});

afterAll(async () => {
  await fuzz.close();
  await reference.close();
});

async function alive(): Promise<void> {
  expect(await liveness(fuzz.proxy.httpPort), "the proxy still answers a good request").toBe(200);
}

describe(`case F3: mutated HTTP/1 messages (seed ${SEED})`, () => {
  it(`${CASES_PLAIN} cases on the plain listener and ${CASES_TLS} over TLS`, {
    timeout: 45_000,
  }, async () => {
    const rng = prng(SEED);
    const targets = {
      httpPort: fuzz.proxy.httpPort,
      tlsPort: fuzz.proxy.tlsPort,
      caPem: fuzz.proxy.caPem,
      referencePort: reference.port,
    };
    let refused = 0;
    let forwarded = 0;
    const run = async (id: number, overTls: boolean) => {
      const outcome = await fuzzCase(targets, rng, id, overTls);
      expect(outcome.leaked, `case ${id}: the proxy's answer carries the secret`).toBe(false);
      refused += outcome.refused;
      forwarded += outcome.forwarded;
    };
    const total = CASES_PLAIN + CASES_TLS;
    for (let start = 0; start < total; start += BATCH) {
      const batch: Array<Promise<void>> = [];
      for (let id = start; id < Math.min(total, start + BATCH); id++) batch.push(run(id, id >= CASES_PLAIN));
      await Promise.all(batch);
      if (start % 100 === 0) await alive();
    }
    await alive();
    // Let responses that were cut off settle upstream before comparing.
    await new Promise((r) => setTimeout(r, 100));
    const oracle = new ForwardOracle();
    oracle.reference(reference.seen);
    const findings = [
      ...oracle.forwarded(fuzz.plainUp.seen, PLAIN_HOST, "plain upstream"),
      ...oracle.forwarded(fuzz.tlsUp.seen, TLS_HOST, "TLS upstream"),
      ...oracle.settle(),
    ];
    expect(findings).toEqual([]);
    expect(fuzz.tlsUp.seen.every((x) => x.headers.authorization === `Bearer ${CANARY}`)).toBe(true);
    // The fuzz must exercise both ways, or it proves nothing.
    expect(refused).toBeGreaterThan(30);
    expect(forwarded).toBeGreaterThan(30);
    expect(fuzz.plainUp.seen.some((s) => s.url === "/SMUGGLED")).toBe(true); // the client's own pipelined request
  });
});
