import type { Context } from "hono";
import { ApiError, type Failure, type Result } from "../../errors";
import type { PageEnv } from "../context";
import { flashQuery } from "../layout";

// How the vault page's forms are answered (every section module in this folder; the keys page
// answers its forms the same way): a 303 back to the page's section with a flash (the service's
// own detail on failure) and the fields worth keeping (never a secret's value). What a section
// is drawn with is section.tsx.

export type Ctx = Context<PageEnv>;

export const PAGE = "/manage/vault";

// ---- answering a form ----

/** Form fields kept across the redirect so a refused form is not retyped (never a value). */
export type Keep = Record<string, string | undefined>;

/** Where a form's answer goes: a section of the vault page (its anchor), or another page. */
export type Where = string | { path: string; anchor?: string };

/** Back to the page with a flash and the kept fields. */
export async function back(
  c: Ctx,
  flash: { ok?: string; error?: string },
  to: Where,
  keep: Keep = {},
): Promise<Response> {
  const q = await flashQuery(c.var.session.csrf, flash);
  for (const [k, v] of keepQuery(keep)) q.set(k, v.slice(0, 1024));
  const { path, anchor } = typeof to === "string" ? { path: PAGE, anchor: to } : to;
  return c.redirect(`${path}?${q}${anchor ? `#${anchor}` : ""}`, 303);
}

export const keepQuery = (keep: Keep) =>
  new URLSearchParams(Object.entries(keep).flatMap(([k, v]) => (v ? [[k, v]] : [])));

/** A service's answer as a redirect: its detail on failure (the API's own words), else `ok`. */
export function answer<T>(
  c: Ctx,
  result: Result<T>,
  ok: (value: T) => string,
  to: Where,
  keep: Keep = {},
): Promise<Response> {
  return result.ok ? back(c, { ok: ok(result.value) }, to) : refused(c, result.error, to, keep);
}

export const refused = (c: Ctx, f: Failure, to: Where, keep: Keep = {}) =>
  back(c, { error: f.detail }, to, keep);

/** Runs a form action; an ApiError a service throws becomes a flash like a returned failure. */
export async function act(c: Ctx, to: Where, fn: () => Promise<Response>): Promise<Response> {
  try {
    return await fn();
  } catch (e) {
    if (e instanceof ApiError) return refused(c, e, to);
    throw e;
  }
}

export async function form(c: Ctx): Promise<Record<string, string>> {
  const body = await c.req.parseBody();
  const fields: Record<string, string> = {};
  for (const [k, v] of Object.entries(body)) if (typeof v === "string") fields[k] = v;
  return fields;
}

/** A trimmed text field, or undefined when missing or blank. */
export function text(fields: Record<string, string>, name: string): string | undefined {
  const v = fields[name]?.trim();
  return v ? v : undefined;
}

export const who = (c: Ctx) => c.var.session.principal;

/**
 * A list field: items split on commas (and newlines, for a textarea of paths), trimmed, blanks
 * dropped; null when none is left (a blank limit field is no limit). The service checks each.
 */
export function listField(fields: Record<string, string>, name: string): string[] | null {
  const items = (fields[name] ?? "")
    .split(/[,\n]/)
    .map((s) => s.trim())
    .filter((s) => s !== "");
  return items.length > 0 ? items : null;
}

/** A limit list as a form shows it again: comma-separated, or blank for none. */
export const listText = (items: readonly string[] | null | undefined) => (items ?? []).join(", ");
