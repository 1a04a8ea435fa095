import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { expect } from "vitest";
import { coordinatorStub } from "../../src/coordinator/client";
import type { Browser, PageResponse } from "./browser";
import type { Tenant } from "./harness";

// What the page tests (pages-run*.test.ts, pages-vault-*.test.ts) read pages with, on top of the
// browser (browser.ts): the run pages' text and assertions, and the vault page's recording
// browser and API read-backs. Apart from the tests so each section's file stays about its page.

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

// --- The vault page ---

export const VAULT = "/manage/vault";

/** Everything a browser was sent: status, headers, body. */
const seen = (res: PageResponse) =>
  `${res.status}\n${[...res.headers].map(([k, v]) => `${k}: ${v}`).join("\n")}\n\n${res.html}`;

/** A browser that keeps every response it got, for the leak scan at the end. */
export function recording(b: Browser) {
  const log: string[] = [];
  return {
    log,
    async get(path: string) {
      const res = await b.get(path);
      log.push(`GET ${path}\n${seen(res)}`);
      return res;
    },
    async post(path: string, fields: Record<string, string | string[]>) {
      const res = await b.post(path, fields);
      log.push(`POST ${path}\n${seen(res)}`);
      return res;
    },
    /** Posts, expects a 303 back to the vault page, follows it; returns the page and the flash. */
    async submit(path: string, fields: Record<string, string | string[]>) {
      const res = await this.post(path, fields);
      expect(res.status, res.html).toBe(303);
      expect(res.location ?? "").toMatch(/^\/manage\/vault(\?|$)/);
      const url = new URL(res.location ?? "", "http://x");
      const page = await this.get(`${url.pathname}${url.search}`);
      expect(page.status).toBe(200);
      return { page, ok: url.searchParams.get("ok"), error: url.searchParams.get("error") };
    },
  };
}

/** The vault's secrets, read back over the API. */
export const api = {
  secrets: async (t: Tenant) =>
    (await t.api("GET", "/v1/vault/secrets")).json.secrets as {
      id: string;
      name: string;
      fingerprint: string;
    }[],
};

/** The id in a form action on the page, e.g. the secret whose row shows `name`. */
export function actionIds(html: string, kind: string): string[] {
  return [...html.matchAll(new RegExp(`action="/manage/vault/${kind}/([a-z]+_[A-Za-z0-9]+)/`, "g"))].map(
    (m) => m[1] ?? "",
  );
}

/** The vault's rules, host entries and settings, read back over the API. */
export const apiOf = (t: Tenant) => ({
  rules: async () =>
    (await t.api("GET", "/v1/vault/rules")).json.rules as {
      id: string;
      host: string;
      secret: string;
      inject: { scheme: string; name: string };
    }[],
  hosts: async () =>
    (await t.api("GET", "/v1/vault/hosts")).json.hosts as {
      id: string;
      pattern: string;
      action: string;
      implicit: boolean;
    }[],
  settings: async () =>
    (await t.api("GET", "/v1/vault/settings")).json as { default: string; version: number },
});

/** The routing section's text, tags dropped. */
export function routing(html: string): string {
  const m = /<section id="routing">([\s\S]*?)<\/section>/.exec(html);
  return (m?.[1] ?? "").replace(/<[^>]+>/g, "").replace(/\s+/g, " ");
}
