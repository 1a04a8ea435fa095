import type { RunSpec } from "@benchwright/shared/contract/run-spec";

// The built-in benchmarks a run may name (`benchmark`) instead of giving its commands inline.

// The demo benchmark (what `npm start` launches): calls the demo API host without a key, tries
// the blocked host, and prints what it saw as one JSON line. No single quotes: it runs as
// `node -e '...'` under `sh -c`.
const DEMO_SCRIPT = `
const get = async (url) => {
  try {
    const res = await fetch(url);
    const text = await res.text();
    let body = null;
    try { body = JSON.parse(text); } catch {}
    return { status: res.status, body };
  } catch (e) {
    return { error: String(e.cause?.code ?? e.message) };
  }
};
(async () => {
  const api = await get("https://api.demo.test/v1/whoami");
  const blocked = await get("https://blocked.demo.test/");
  const envNames = Object.keys(process.env).sort();
  console.log(JSON.stringify({ demo: true, api, blocked, envNames }));
})();
`;

/** Built-in benchmarks: a name → the commands it runs. */
export const BENCHMARKS: Readonly<Record<string, readonly string[]>> = {
  demo: [`node -e '${DEMO_SCRIPT.trim()}'`],
};

/** Whether `name` is a built-in benchmark. */
export const isBenchmark = (name: string): boolean => Object.hasOwn(BENCHMARKS, name);

/** The commands of the work sandbox: the inline ones or the benchmark's. */
export function commandsOf(spec: RunSpec): readonly string[] {
  if (spec.commands) return spec.commands;
  return BENCHMARKS[spec.benchmark ?? ""] ?? [];
}
