import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { expect } from "vitest";
import { coordinatorStub } from "../../src/coordinator/run-coordinator";
import type { PageResponse } from "./browser";
import type { Tenant } from "./harness";

// What the page tests (pages-run*.test.ts) read pages with, on top of the browser (browser.ts):
// the run pages' text and assertions. Apart from the tests so each section's file stays about
// its page.

// --- The run pages ---

/** Launches a run through the API, as a user would; its id. */
export async function launch(
  t: Tenant,
  spec: Record<string, unknown> = { commands: ["echo hi"] },
): Promise<string> {
  const res = await t.api("POST", "/v1/runs", spec);
  if (res.status !== 202) throw new Error(`launch: ${res.status} ${res.text}`);
  return res.json.id;
}

/** The page's visible text, roughly: tags dropped, entities decoded, whitespace squeezed. */
export function textOf(html: string): string {
  return html
    .replace(/<style>[\s\S]*?<\/style>/g, " ")
    .replace(/<[^>]+>/g, " ")
    .replaceAll("&lt;", "<")
    .replaceAll("&gt;", ">")
    .replaceAll("&quot;", '"')
    .replaceAll("&#39;", "'")
    .replaceAll("&amp;", "&")
    .replace(/\s+/g, " ");
}

/** The value the coordinator Durable Object stored under `key` (what its methods were asked). */
export const stored = (runId: string, key: string) =>
  runInDurableObject(coordinatorStub(env, runId), (_o, state) => state.storage.get(key));

/** The flash a form's redirect carries (its MAC, `fs`, is checked by the page that shows it). */
export function flashOf(res: PageResponse): Record<string, string> {
  expect(res.status).toBe(303);
  const { fs, ...flash } = Object.fromEntries(new URL(res.location ?? "", "http://x").searchParams);
  expect(fs).toMatch(/^[0-9a-f]{64}$/);
  return flash;
}

/** Asserts `page` contains (or, with `not`, lacks) `needle`, quoting only a little of the page. */
export function has(page: string, needle: string | RegExp, not = false) {
  const found = typeof needle === "string" ? page.includes(needle) : needle.test(page);
  if (found === not) {
    throw new Error(
      `expected the page ${not ? "not " : ""}to contain ${String(needle)}; page: ${page.slice(0, 600)}…`,
    );
  }
}
export const lacks = (page: string, needle: string | RegExp) => has(page, needle, true);

/** Asserts `res` is a page (status, type, CSP; no script, no stack) and returns its text. */
export function expectPage(res: PageResponse, status = 200): string {
  if (res.status !== status)
    throw new Error(`expected ${status}, got ${res.status}: ${res.html.slice(0, 400)}`);
  expect(res.headers.get("content-type")).toMatch(/^text\/html/);
  expect(res.headers.get("content-security-policy")).toContain("default-src 'none'");
  // Pages never run script and never show a stack.
  lacks(res.html, /<script/i);
  lacks(res.html, /\n\s+at .*\(.*:\d+:\d+\)/);
  return textOf(res.html);
}
