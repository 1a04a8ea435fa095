// Summarises a V8 .cpuprofile (node --cpu-prof) into its top self-time entries: by function and
// source file, and by file, as % of samples. For the proxy bench's profile:
//
//   BENCH_PROXY_NODE_ARGS=--cpu-prof BENCH_KEEP_TMP=1 npm run bench:proxy
//   npx tsx bench/profile-summary.ts /tmp/bw-bench-XXXX/CPU.*.cpuprofile [--top 25] [--out file.md]
//
// The proxy runs as one bundle, so every frame of its own code is in proxy.cjs: with the bundle's
// source map beside the profile (the bench writes proxy.cjs.map) frames are named by their
// original file (proxy-image/src/..., src/..., node_modules/<package>/...) and line.
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { SourceMap } from "node:module";
import { basename, dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { ROOT } from "./lib/results";

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
  columnNumber: number;
}
interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  hitCount?: number;
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  startTime: number;
  endTime: number;
}

export interface Entry {
  name: string;
  file: string;
  samples: number;
  pct: number;
  /** For a native function: the JS callers its samples came from, by samples. */
  callers?: Map<string, number>;
}

interface Mapped {
  map: SourceMap;
  lines: string[];
}

/**
 * Where a frame comes from (a repository path, node_modules/<pkg>/..., node:..., or (native)) and
 * its name: a minified bundle's own (`wme`), unless its source map names the identifier at the
 * function's start (`_resume`).
 */
function locate(frame: CallFrame, maps: Map<string, Mapped | null>): { where: string; name: string } {
  const { url } = frame;
  const name = frame.functionName || "(anonymous)";
  if (url === "") return { where: "(native)", name };
  if (url.startsWith("node:")) return { where: url, name };
  const file = url.startsWith("file://") ? fileURLToPath(url) : url;
  let mapped = maps.get(file);
  if (mapped === undefined) {
    const mapFile = `${file}.map`;
    mapped = existsSync(mapFile)
      ? {
          map: new SourceMap(JSON.parse(readFileSync(mapFile, "utf8"))),
          lines: readFileSync(file, "utf8").split("\n"),
        }
      : null;
    maps.set(file, mapped);
  }
  if (mapped) {
    const hit = mapped.map.findEntry(frame.lineNumber, frame.columnNumber) as {
      generatedColumn?: number;
      originalSource?: string;
      originalLine?: number;
      name?: string;
    };
    // The mapping just before the frame's position is the function's own name only when the
    // bundle's text there is that (minified) name.
    const named =
      hit.name !== undefined &&
      frame.functionName !== "" &&
      mapped.lines[frame.lineNumber]?.startsWith(frame.functionName, hit.generatedColumn ?? -1) === true;
    if (hit.originalSource) {
      const src = hit.originalSource.startsWith("file://")
        ? fileURLToPath(hit.originalSource)
        : resolve(dirname(file), hit.originalSource);
      const rel = relative(ROOT, src);
      const shown = rel.startsWith("..") ? src : rel;
      return {
        where: `${shown.replace(/^.*node_modules\//, "node_modules/")}:${(hit.originalLine ?? 0) + 1}`,
        name: named ? (hit.name as string) : name,
      };
    }
  }
  return { where: `${basename(file)}:${frame.lineNumber + 1}`, name };
}

/** Self-time samples per (function, file) and per file, largest first. */
export function summarise(profile: Profile): { byFunction: Entry[]; byFile: Entry[]; total: number } {
  const maps = new Map<string, Mapped | null>();
  const self = new Map<number, number>();
  for (const id of profile.samples) self.set(id, (self.get(id) ?? 0) + 1);
  const total = profile.samples.length;
  const fn = new Map<string, Entry>();
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const files = new Map<string, Entry>();
  for (const node of profile.nodes) {
    const n = self.get(node.id) ?? 0;
    if (n === 0) continue;
    const { where, name } = locate(node.callFrame, maps);
    const key = `${name}\u0000${where}`;
    const e = fn.get(key) ?? { name, file: where, samples: 0, pct: 0 };
    e.samples += n;
    fn.set(key, e);
    if (where === "(native)" && !name.startsWith("(")) {
      // A native function's cost belongs to whoever called it: the nearest caller outside Node.
      let up = parent.get(node.id);
      const inNode = (id: number) => {
        const u = byId.get(id)?.callFrame.url ?? "";
        return u === "" || u.startsWith("node:");
      };
      while (up !== undefined && inNode(up)) up = parent.get(up);
      // None (called from Node's own stream machinery, on a later tick): the nearest with a file.
      if (up === undefined) {
        up = parent.get(node.id);
        while (up !== undefined && byId.get(up)?.callFrame.url === "") up = parent.get(up);
      }
      const caller = up === undefined ? null : byId.get(up);
      if (caller) {
        const c = locate(caller.callFrame, maps);
        const label = `${c.name} (${c.where})`;
        e.callers ??= new Map();
        e.callers.set(label, (e.callers.get(label) ?? 0) + n);
      }
    }
    if (name === "(idle)") continue; // the by-file table is of busy time only
    const fileOnly = where.replace(/:\d+$/, "");
    const g = files.get(fileOnly) ?? { name: "", file: fileOnly, samples: 0, pct: 0 };
    g.samples += n;
    files.set(fileOnly, g);
  }
  const sorted = (m: Map<string, Entry>) =>
    [...m.values()]
      .map((e) => ({ ...e, pct: (e.samples / Math.max(1, total)) * 100 }))
      .sort((a, b) => b.samples - a.samples);
  return { byFunction: sorted(fn), byFile: sorted(files), total };
}

/** The top three callers of a native entry, with their share of its samples. */
function callersOf(e: Entry): string {
  if (!e.callers) return "";
  return [...e.callers.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, 3)
    .map(([label, n]) => `${label} ${((n / e.samples) * 100).toFixed(0)} %`)
    .join("; ");
}

export function renderSummary(profile: Profile, file: string, top: number): string {
  const { byFunction, byFile, total } = summarise(profile);
  const seconds = (profile.endTime - profile.startTime) / 1e6;
  const idle = byFunction.find((e) => e.name === "(idle)");
  const lines = [
    `Profile \`${basename(file)}\`: ${total.toLocaleString("en-US")} samples over ${seconds.toFixed(1)} s` +
      (idle ? `, ${idle.pct.toFixed(1)} % of them idle` : "") +
      ". Self time: the samples in which the function itself was running (not its callees).",
    "",
    "| # | function | file:line | samples | % of samples | % of busy samples | a native's nearest callers outside Node, else in it (share of its samples) |",
    "| ---: | --- | --- | ---: | ---: | ---: | --- |",
  ];
  const busy = total - (idle?.samples ?? 0);
  for (const [i, e] of byFunction.slice(0, top).entries())
    lines.push(
      `| ${i + 1} | \`${e.name}\` | ${e.file} | ${e.samples.toLocaleString("en-US")} | ${e.pct.toFixed(1)} | ${e.name === "(idle)" ? "" : ((e.samples / Math.max(1, busy)) * 100).toFixed(1)} | ${callersOf(e)} |`,
    );
  lines.push(
    "",
    "By file (self time of every function in it, idle left out):",
    "",
    "| file | samples | % of samples | % of busy samples |",
    "| --- | ---: | ---: | ---: |",
  );
  for (const e of byFile.slice(0, top))
    lines.push(
      `| ${e.file} | ${e.samples.toLocaleString("en-US")} | ${e.pct.toFixed(1)} | ${((e.samples / Math.max(1, busy)) * 100).toFixed(1)} |`,
    );
  return `${lines.join("\n")}\n`;
}

function main(): void {
  const args = process.argv.slice(2);
  const opt = (name: string) => {
    const i = args.indexOf(name);
    if (i < 0) return undefined;
    const v = args[i + 1];
    args.splice(i, 2);
    return v;
  };
  const top = Number(opt("--top") ?? 25);
  const out = opt("--out");
  let file = args[0];
  if (!file)
    throw new Error("usage: profile-summary.ts <file.cpuprofile | directory> [--top N] [--out file.md]");
  if (!file.endsWith(".cpuprofile")) {
    const found = readdirSync(file).filter((f) => f.endsWith(".cpuprofile"));
    if (found.length !== 1) throw new Error(`${file}: expected one .cpuprofile, found ${found.length}`);
    file = join(file, found[0] as string);
  }
  const text = renderSummary(JSON.parse(readFileSync(file, "utf8")) as Profile, file, top);
  if (out) writeFileSync(out, text);
  else process.stdout.write(text);
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
