import type { Finding } from "../../test/proxy/fuzz-lib";
import { f, int, type SectionHead } from "./results";

// The fuzz bench's section of the results page (bench/fuzz-bench.ts).

export interface FuzzResults extends SectionHead {
  config: { cases: number; concurrency: number; batch: number; seed: number; idleMs: number; gapMs: number };
  /** Cases sent (fewer than asked when the proxy crashed). */
  cases: number;
  fuzzS: number;
  casesPerS: number;
  crashes: string[];
  /** Forwards the oracle could not account for, malformed forwards, leaks, missing injections. */
  ambiguousForwards: number;
  /** The first of them, with the case's chunks when it could be told. */
  findings: Array<Finding & { caseId?: number; chunks?: string[] }>;
  responses: { refused: number; answered: number; casesWithoutAnswer: number };
  upstream: { plain: number; tls: number };
  referenceParsed: number;
  proxyDecisions: Record<string, number>;
  /** Cores used over the fuzz loop: the bench (clients and the reference) and the proxy process. */
  cpuCores: { bench: number; proxy: number };
  proxyRssMiB: { start: number; end: number; peak: number };
}

export function fuzzSection(r: FuzzResults): FuzzResults {
  return {
    ...r,
    summary: [
      {
        measure: `mutated HTTP/1 requests through the proxy (seed ${r.config.seed})`,
        result: `${int(r.cases)} cases, ${f(r.casesPerS, 0)} cases/s`,
        baseline: "",
        ratio: "",
      },
      {
        measure: "proxy crashes",
        result: String(r.crashes.length),
        baseline: "",
        ratio: "",
        target: "0",
        met: r.crashes.length === 0,
      },
      {
        measure: "ambiguous forwards",
        result: String(r.ambiguousForwards),
        baseline: `${int(r.referenceParsed)} requests the strict reference parsed`,
        ratio: "",
        target: "0",
        met: r.ambiguousForwards === 0,
      },
    ],
  };
}

export function renderFuzz(r: FuzzResults): string {
  const c = r.config;
  const ok = r.crashes.length === 0 && r.ambiguousForwards === 0;
  const lines = [
    "## Fuzz bench (`npm run bench:fuzz`, bench/fuzz-bench.ts)",
    "",
    ...(r.short ? [`**Short run**: ${int(c.cases)} cases, below the default 100,000.`, ""] : []),
    `- date: ${r.date}, commit ${r.commit}, whole run ${f(r.wallS, 0)} s`,
    `- machine: ${r.machine.cores} cores (${r.machine.cpu}), Node ${r.machine.node}`,
    `- ${int(c.cases)} cases asked, seed ${c.seed} (\`FUZZ_SEED=${c.seed} npm run bench:fuzz\` replays them), ` +
      `${c.concurrency} in flight, liveness and oracle checkpoint every ${int(c.batch)}; each case ` +
      `${c.gapMs} ms between chunks and done after ${c.idleMs} ms of quiet (as in the test)`,
    "",
    `**${ok ? "Passed" : "FAILED"}**: ${r.crashes.length} crashes, ${r.ambiguousForwards} ambiguous forwards (both must be 0).`,
    "",
    "Case F3 of docs/attack-cases.md at scale, with the test's own fuzzer and oracle",
    "(test/proxy/fuzz-lib.ts): a template request (Content-Length or chunked body carrying a smuggled",
    "request, pipelined pairs, a zero-length body followed by a request) mutated one to three times",
    "(bytes replaced, inserted, deleted; header lines duplicated; framing headers and sizes changed),",
    "split into one to five chunks, and sent to the proxy (two cases in three on its plain listener,",
    "one in three over TLS to a host with an injection rule) and, the same chunks, to a strict Node",
    "server (the reference). Every request an upstream received through the proxy must be one the",
    "reference parsed (same method, target, body; each reference parse accounts for one forward),",
    "carry the test host, a body exactly as long as declared and no CR, LF or NUL in a header; on",
    "the TLS path it must carry the injected credential, and no answer to the client may. The proxy",
    "runs in its own process (the harness of the proxy tests); after every checkpoint it must be",
    "alive and answer a well-formed request.",
    "",
    "| measure | value |",
    "| --- | ---: |",
    `| cases sent | ${int(r.cases)} |`,
    `| cases/s (${f(r.fuzzS, 0)} s) | ${f(r.casesPerS, 0)} |`,
    `| responses from the proxy: refusals (≥ 400) / others | ${int(r.responses.refused)} / ${int(r.responses.answered)} |`,
    `| cases the proxy closed without a response | ${int(r.responses.casesWithoutAnswer)} |`,
    `| requests the upstreams received: plain / TLS | ${int(r.upstream.plain)} / ${int(r.upstream.tls)} |`,
    `| requests the strict reference parsed | ${int(r.referenceParsed)} |`,
    `| proxy decision records | ${Object.entries(r.proxyDecisions)
      .sort()
      .map(([k, v]) => `${k} ${int(v)}`)
      .join(", ")} |`,
    `| cores used: bench (clients, reference) / proxy process | ${f(r.cpuCores.bench, 2)} / ${f(r.cpuCores.proxy, 2)} |`,
    `| proxy process RSS MiB: start / end / peak | ${f(r.proxyRssMiB.start)} / ${f(r.proxyRssMiB.end)} / ${f(r.proxyRssMiB.peak)} |`,
    "",
    `A case the proxy does not close waits ${c.idleMs} ms of quiet, so with ${c.concurrency} in flight the rate stays near`,
    `${int((c.concurrency * 1000) / Math.max(1, c.idleMs + c.gapMs))} cases/s unless the cores bind first (the clients, the reference and the proxy share`,
    "them): it says how long a number of cases takes, not how fast the proxy parses.",
  ];
  if (r.crashes.length > 0) lines.push("", "Crashes:", "", ...r.crashes.map((x) => `- ${x}`));
  if (r.findings.length > 0)
    lines.push(
      "",
      `Ambiguous forwards (first ${r.findings.length} of ${r.ambiguousForwards}):`,
      "",
      ...r.findings.map(
        (x) =>
          `- ${x.where}: ${x.problem}${x.chunks ? ` (case ${x.caseId}, chunks \`${JSON.stringify(x.chunks)}\`)` : ""}`,
      ),
    );
  return lines.join("\n");
}
