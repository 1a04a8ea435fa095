import {
  buildPolicyIndex,
  compilePolicy,
  type PolicyIndex,
  type VaultSnapshot,
} from "@benchwright/shared/policy/compile";

// Policy-decision time as the proxy pays it per request: `decide` (decideHost, then matchRule
// unless blocked, in one walk of the host's labels) on the index of a compiled document, for a vault of N rules and N host entries. The lookups are the
// same mix at every size: a quarter exact host-entry hits, a quarter wildcard host-entry hits, a
// quarter rule hits (half exact, half wildcard), a quarter misses; the hits are spread over the
// whole vault, so a large one is not served from a few hot cache lines.

export interface DecisionResult {
  rules: number;
  hostEntries: number;
  /** compilePolicy (schema check included) + buildPolicyIndex, what a policy reload costs. */
  buildMs: number;
  /** Median over rounds of `decide` per lookup. */
  nsPerOp: number;
}

// Fixed-width numbers, so host names are as long at 10 entries as at 100,000 (parsing a host
// costs by its length, and that must not differ between the sizes compared).
const id = (i: number) => String(i).padStart(6, "0");

function vaultOf(n: number): VaultSnapshot {
  const hosts: VaultSnapshot["hosts"][number][] = [];
  const rules: VaultSnapshot["rules"][number][] = [];
  for (let i = 0; i < n; i++) {
    hosts.push(
      i % 2 === 0
        ? { pattern: `h${id(i)}.hosts.example`, action: i % 4 === 0 ? "allow" : "block" }
        : { pattern: `*.w${id(i)}.hosts.example`, action: i % 4 === 1 ? "block" : "allow" },
    );
    rules.push({
      host: i % 2 === 0 ? `r${id(i)}.rules.example` : `*.rw${id(i)}.rules.example`,
      secret: `S${i % 16}`,
      inject: { scheme: "bearer", name: "authorization" },
    });
  }
  return { version: 1, default: "allow", hosts, rules };
}

/** Lookup hosts for a vault of n entries (see the mix above); deterministic. */
function lookupsFor(n: number, count: number): string[] {
  const out: string[] = [];
  let seed = 0x9e3779b9;
  const rand = (m: number) => {
    seed = (Math.imul(seed ^ (seed >>> 15), 0x2c1b3c6d) + 0x6d2b79f5) >>> 0;
    return seed % m;
  };
  // An index below n with the given parity (even: exact entries, odd: wildcards).
  const pick = (parity: number) => rand(Math.floor(n / 2)) * 2 + parity;
  for (let k = 0; k < count; k++) {
    switch (k % 8) {
      case 0:
      case 1:
        out.push(`h${id(pick(0))}.hosts.example`);
        break;
      case 2:
      case 3:
        out.push(`api.w${id(pick(1))}.hosts.example`);
        break;
      case 4:
        out.push(`r${id(pick(0))}.rules.example`);
        break;
      case 5:
        out.push(`v1.rw${id(pick(1))}.rules.example`);
        break;
      default:
        out.push(`miss${id(rand(1_000_000))}.elsewhere.example`);
    }
  }
  return out;
}

function timeRound(index: PolicyIndex, hosts: readonly string[], passes: number): number {
  let sink = 0;
  const t0 = process.hrtime.bigint();
  for (let p = 0; p < passes; p++) {
    for (const h of hosts) {
      const decided = index.decide(h);
      if (decided.host.action === "block") sink++;
      if (decided.rule !== null) sink++;
    }
  }
  const ns = Number(process.hrtime.bigint() - t0);
  if (sink < 0) throw new Error("unreachable"); // keeps the work observable
  return ns / (passes * hosts.length);
}

export function benchDecisions(sizes: readonly number[], o: { rounds: number; passes: number }) {
  const built = sizes.map((n) => {
    const t0 = performance.now();
    const index = buildPolicyIndex(compilePolicy(vaultOf(n)));
    const buildMs = performance.now() - t0;
    return { n, index, buildMs, hosts: lookupsFor(n, 4096), samples: [] as number[] };
  });
  for (const b of built) timeRound(b.index, b.hosts, o.passes); // warm-up: JIT, caches
  // Interleave the sizes round by round, so drift (turbo, a neighbour) hits both alike.
  for (let r = 0; r < o.rounds; r++)
    for (const b of built) b.samples.push(timeRound(b.index, b.hosts, o.passes));
  return built.map(
    (b): DecisionResult => ({
      rules: b.n,
      hostEntries: b.n,
      buildMs: b.buildMs,
      nsPerOp: b.samples.sort((x, y) => x - y)[Math.floor(b.samples.length / 2)] as number,
    }),
  );
}
