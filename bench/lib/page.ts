import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { renderAudit } from "./audit-report";
import { renderBroker } from "./broker-report";
import { renderFuzz } from "./fuzz-report";
import { renderMemory } from "./memory-report";
import { type Results as ProxyResults, proxySection, renderProxy } from "./report";
import { BENCHES, type BenchName, mark, resultsDir, type SectionHead } from "./results";
import { renderSetup } from "./setup-report";
import { renderStart } from "./start-report";

// bench/results/latest.json holds one section per bench (`benches.<name>`), latest.md is rendered
// from it whole. A bench run alone replaces its own section and leaves the others as they were
// (each says its date and commit), so `npm run bench:fuzz` does not erase the proxy's numbers.

// biome-ignore lint/suspicious/noExplicitAny: each renderer takes its own bench's section
const RENDER: Record<BenchName, (section: any) => string> = {
  proxy: renderProxy,
  memory: renderMemory,
  fuzz: renderFuzz,
  audit: renderAudit,
  broker: renderBroker,
  start: renderStart,
  setup: renderSetup,
};

const TITLE: Record<BenchName, string> = {
  proxy: "proxy",
  memory: "proxy memory",
  fuzz: "fuzz",
  audit: "audit ingest",
  broker: "broker",
  start: "run start",
  setup: "setup images",
};

type Page = { schema: 2; benches: Partial<Record<BenchName, SectionHead>> };

function readPage(dir: string): Page {
  const file = join(dir, "latest.json");
  if (!existsSync(file)) return { schema: 2, benches: {} };
  const json = JSON.parse(readFileSync(file, "utf8"));
  if (json && typeof json === "object" && "benches" in json) return json as Page;
  // Before there was more than one bench, latest.json was the proxy bench's results alone.
  if (json && typeof json === "object" && "phases" in json)
    return { schema: 2, benches: { proxy: proxySection(json as ProxyResults, false) } };
  return { schema: 2, benches: {} };
}

export function renderPage(page: Page): string {
  const lines = [
    "# Benchmarks: latest results",
    "",
    "Written by `npm run bench` (every bench in turn); `npm run bench:<name>` rewrites its own section",
    "only. The same numbers are in `latest.json`. A bench never fails on a time: it measures its",
    "baseline in the same run and reports the ratio (and a target, where one was set, as met or not).",
    "How to reproduce, and every setting: [bench/README.md](../README.md).",
    "",
    "## Summary",
    "",
    "| bench | measure | result | baseline (same run) | ratio | target | run |",
    "| --- | --- | --- | --- | --- | --- | --- |",
  ];
  for (const name of BENCHES) {
    const s = page.benches[name];
    if (!s) {
      lines.push(`| ${TITLE[name]} | not run yet: \`npm run bench:${name}\` | | | | | |`);
      continue;
    }
    const run = `${s.date.slice(0, 10)}, ${s.commit}, Node ${s.machine.node}${s.short ? ", **short run**" : ""}`;
    for (const r of s.summary) {
      const target = r.target
        ? `${r.target}${r.met === undefined ? "" : ` (${mark(r.met ?? null, r.missedBy)})`}`
        : "";
      lines.push(
        `| ${TITLE[name]} | ${r.measure} | ${r.result} | ${r.baseline} | ${r.ratio} | ${target} | ${run} |`,
      );
    }
  }
  for (const name of BENCHES) {
    const s = page.benches[name];
    if (!s) continue;
    try {
      lines.push("", RENDER[name](s).trimEnd());
    } catch (e) {
      // A section written by an older version of its bench: the page still renders.
      lines.push(
        "",
        `## ${TITLE[name]}: not shown (${(e as Error).message}); run \`npm run bench:${name}\` again`,
      );
    }
  }
  return `${lines.join("\n")}\n`;
}

/** Replaces `section`'s bench in latest.json and rewrites latest.md; returns the directory. */
export function publish(section: SectionHead): string {
  const dir = resultsDir();
  mkdirSync(dir, { recursive: true });
  const page = readPage(dir);
  page.benches[section.bench] = section;
  writeFileSync(join(dir, "latest.json"), `${JSON.stringify(page, null, 2)}\n`);
  writeFileSync(join(dir, "latest.md"), renderPage(page));
  return dir;
}

/** Rewrites latest.md from latest.json (after a change of the page's layout). */
export function rerender(): string {
  const dir = resultsDir();
  const page = readPage(dir);
  writeFileSync(join(dir, "latest.json"), `${JSON.stringify(page, null, 2)}\n`);
  writeFileSync(join(dir, "latest.md"), renderPage(page));
  return dir;
}

/** The summary as console lines. */
export function summaryLines(section: SectionHead): string {
  return section.summary
    .map(
      (r) =>
        `  ${r.measure}: ${r.result}${r.baseline ? ` vs ${r.baseline}` : ""}${r.ratio ? ` = ${r.ratio}` : ""}${r.target ? ` (target ${r.target}: ${mark(r.met ?? null, r.missedBy)})` : ""}`,
    )
    .join("\n");
}
