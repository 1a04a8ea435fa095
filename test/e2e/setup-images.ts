import { lstatSync, readdirSync, readFileSync, readlinkSync } from "node:fs";
import { join, relative } from "node:path";
import type { Api, TraceEvent } from "./harness";

// What the end-to-end tests of setup images read (issue 34): the trace's setup-image rows, the
// run page as a signed-in browser gets it, and the canary walk over a directory of stored
// layers (case P4).

/** A builder's capture row: "Setup image sha256:… built now (N MiB, F files) from the setup of X". */
export interface ImageBuilt {
  name: string;
  digest: string;
  bytes: number;
  files: number;
  text: string;
}

/** A sandbox made from an image: "X starts from setup image sha256:…, built by run Y". */
export interface ImageUsed {
  name: string;
  digest: string;
  builtByRunId: string | null;
  builtNow: boolean;
  text: string;
}

/** The run's setup-image rows, split into captures (built) and starts from an image (used). */
export function setupImageRows(run: { trace: TraceEvent[] }): {
  built: ImageBuilt[];
  used: ImageUsed[];
  /** Every other setup-image row's text (why setup ran uncached, a build lost). */
  other: string[];
} {
  const rows = run.trace.filter((e) => e.kind === "note" && e.detail?.stage === "setup_image");
  const built: ImageBuilt[] = [];
  const used: ImageUsed[] = [];
  const other: string[] = [];
  for (const { detail: d } of rows) {
    if (typeof d.digest === "string" && typeof d.bytes === "number") {
      built.push({ name: d.name, digest: d.digest, bytes: d.bytes, files: d.files, text: d.text });
    } else if (typeof d.digest === "string") {
      used.push({
        name: d.name,
        digest: d.digest,
        builtByRunId: d.builtByRunId ?? null,
        builtNow: d.builtNow === true,
        text: d.text,
      });
    } else other.push(d.text);
  }
  return { built, used, other };
}

/** The names of the sandboxes whose setup commands ran (a setup-stage output row of theirs). */
export function setupRanIn(run: { trace: TraceEvent[] }): string[] {
  const names = run.trace
    .filter((e) => e.kind === "output" && e.detail?.stage === "setup")
    .map((e) => e.detail.name as string);
  return [...new Set(names)].sort();
}

/** The run page (/runs/{id}) as the key's browser session sees it: its text, one space between words. */
export async function runPageText(apiUrl: string, api: Api, runId: string): Promise<string> {
  const login = await fetch(`${apiUrl}/login`, {
    method: "POST",
    redirect: "manual",
    headers: { "content-type": "application/x-www-form-urlencoded", origin: apiUrl },
    body: new URLSearchParams({ key: api.key, next: `/runs/${runId}` }),
  });
  const cookie = /bw_session=[^;]+/.exec(login.headers.get("set-cookie") ?? "")?.[0];
  if (!cookie) throw new Error(`login failed: ${login.status} ${await login.text()}`);
  const page = await fetch(`${apiUrl}/runs/${runId}`, { headers: { cookie } });
  if (page.status !== 200) throw new Error(`run page: ${page.status}`);
  return (await page.text())
    .replace(/<[^>]+>/g, " ")
    .replace(/&#39;/g, "'")
    .replace(/&quot;/g, '"')
    .replace(/&amp;/g, "&")
    .replace(/\s+/g, " ");
}

/** One sandbox's "Stages of <name>" card of the run page's text (runPageText). */
export function stagesCard(page: string, name: string): string {
  const card = page.split("Stages of ").find((c) => c.startsWith(`${name} Stage `));
  if (!card) throw new Error(`the run page has no stages of ${name}`);
  return card.split(" Trace ")[0] as string;
}

export interface TreeHit {
  /** The file (or link, or name) relative to the scanned directory. */
  path: string;
  needle: string;
}

/**
 * The canary walk over a directory (case P4): every entry under `dir`, never following a link,
 * its name and a link's target searched for the needles, and every regular file's bytes read as
 * latin1 (one character per byte: an ASCII needle is found wherever its bytes are, in a tar
 * archive as in a plain file). Run as root, it reads files of any owner and mode.
 */
export function scanTree(dir: string, needles: readonly string[]): { files: number; hits: TreeHit[] } {
  const hits: TreeHit[] = [];
  let files = 0;
  const look = (path: string, text: string) => {
    for (const needle of needles) if (text.includes(needle)) hits.push({ path: relative(dir, path), needle });
  };
  const walk = (path: string) => {
    for (const name of readdirSync(path)) {
      const entry = join(path, name);
      look(entry, name);
      const st = lstatSync(entry);
      if (st.isDirectory()) walk(entry);
      else if (st.isSymbolicLink()) look(entry, readlinkSync(entry));
      else if (st.isFile()) {
        files++;
        look(entry, readFileSync(entry).toString("latin1"));
      }
    }
  };
  walk(dir);
  return { files, hits };
}
