import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";

// Part of `npm run check`: every attack case in docs/attack-cases.md has a test that cites it.
//
// The one citation form: `case <ID>`, "case" in any letter case, one space, the id as written in
// the document (an upper-case letter and digits), then a word boundary. In a comment
// (`// case A12`) or a test title (`it("case A12: ...")`). Nothing else counts: not "A12:", not
// `id: "A12"`, not a list ("case E6, E1, E2" cites E6 only) nor a range ("cases A1–A6"). A test
// whose title is built at run time (`case ${c.id}`) needs a `// case A1` comment at its table rows.
//
// Only test files (`*.test.ts`, `*.test.mjs` under test/) count: a harness that mentions a case is
// not a test of it. docs/attack-cases.md holds every case of ../shared/attack-cases.md (the floor),
// word for word, plus the cases of ../shared/attack-cases-next.md that the work so far covers, so
// a clean clone (CI) can check it; where ../shared exists, each of its cases must be in the copy.

const root = join(fileURLToPath(import.meta.url), "..", "..");
export const CASES_DOC = join(root, "docs", "attack-cases.md");
export const SHARED_DOC = join(root, "..", "shared", "attack-cases.md");
export const TEST_DIR = join(root, "test");

/** The case ids of the document, in order: `- A1 ...` lines under `## A. ...` headings. */
export function parseCaseIds(markdown: string): string[] {
  const ids: string[] = [];
  let section: string | null = null;
  for (const line of markdown.split("\n")) {
    const heading = /^## ([A-Z])\. /.exec(line);
    if (heading) section = heading[1] as string;
    const item = /^- ([A-Z])(\d+) /.exec(line);
    if (!item) continue;
    const id = `${item[1]}${item[2]}`;
    if (item[1] !== section) throw new Error(`attack case ${id} is not under its "## ${item[1]}." heading`);
    if (ids.includes(id)) throw new Error(`attack case ${id} is listed twice`);
    ids.push(id);
  }
  return ids;
}

/** The case lines of a document by id: `- A1 ...` as written. */
export function caseLines(markdown: string): Map<string, string> {
  const ids = parseCaseIds(markdown);
  const lines = markdown.split("\n").filter((l) => /^- [A-Z]\d+ /.test(l));
  return new Map(ids.map((id, i) => [id, lines[i] as string]));
}

/** The floor's cases missing from the copy, or present in other words. */
export function missingFromCopy(copy: string, floor: string): string[] {
  const have = caseLines(copy);
  return [...caseLines(floor)].filter(([id, line]) => have.get(id) !== line).map(([id]) => id);
}

/** The ids a text cites in the strict form `case <ID>`. */
export function citedIds(text: string): Set<string> {
  const out = new Set<string>();
  for (const m of text.matchAll(/\bcase ([A-Za-z]\d+)\b/gi)) {
    const id = m[1] as string;
    // The `i` flag is for "case"; the id itself must be written upper-case.
    if (/^[A-Z]/.test(id)) out.add(id);
  }
  return out;
}

export interface SourceFile {
  path: string;
  text: string;
}

/** For each id, the files that cite it (in the order given); ids no file cites map to []. */
export function citations(ids: readonly string[], files: readonly SourceFile[]): Map<string, string[]> {
  const out = new Map<string, string[]>(ids.map((id) => [id, []]));
  for (const file of files) {
    for (const id of citedIds(file.text)) out.get(id)?.push(file.path);
  }
  return out;
}

export function uncited(cited: Map<string, string[]>): string[] {
  return [...cited].filter(([, files]) => files.length === 0).map(([id]) => id);
}

/** Test files under `dir`, as paths relative to the repository root with `/`, sorted. */
export function testFiles(dir = TEST_DIR): SourceFile[] {
  const found: string[] = [];
  const walk = (d: string) => {
    for (const entry of readdirSync(d, { withFileTypes: true })) {
      const path = join(d, entry.name);
      if (entry.isDirectory()) walk(path);
      else if (/\.test\.(ts|mjs)$/.test(entry.name)) found.push(path);
    }
  };
  walk(dir);
  return found.sort().map((path) => ({
    path: relative(root, path).split(sep).join("/"),
    text: readFileSync(path, "utf8"),
  }));
}

export interface Report {
  /** What was found: per id, the files citing it (verbose), then the one-line summary. */
  lines: string[];
  /** Why the check fails, if it does. */
  error: string | null;
}

export function checkAttackCases(
  opts: { doc?: string; shared?: string; files?: SourceFile[]; verbose?: boolean } = {},
): Report {
  const doc = opts.doc ?? CASES_DOC;
  const shared = opts.shared ?? SHARED_DOC;
  const markdown = readFileSync(doc, "utf8");
  if (existsSync(shared)) {
    const missing = missingFromCopy(markdown, readFileSync(shared, "utf8"));
    if (missing.length > 0) {
      const copy = relative(root, doc);
      return {
        lines: [],
        error: `${copy} lacks cases of ${shared}, or words them differently: ${missing.join(", ")} (copy each line over)`,
      };
    }
  }
  const ids = parseCaseIds(markdown);
  const cited = citations(ids, opts.files ?? testFiles());
  const lines: string[] = [];
  if (opts.verbose) {
    for (const [id, files] of cited) lines.push(`${id.padEnd(4)} ${files.join(", ") || "-"}`);
  }
  const missing = uncited(cited);
  if (missing.length > 0) {
    const error =
      `${missing.length} of ${ids.length} attack cases in ${relative(root, doc)} have no test citing them ` +
      `("case <ID>" in a *.test.ts): ${missing.join(", ")}`;
    return { lines, error };
  }
  const citing = new Set([...cited.values()].flat());
  lines.push(`${ids.length} cases, all cited in ${citing.size} test files`);
  return { lines, error: null };
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const report = checkAttackCases({ verbose: process.argv.includes("--verbose") });
  for (const line of report.lines) console.log(line);
  if (report.error) {
    console.error(report.error);
    process.exit(1);
  }
}
