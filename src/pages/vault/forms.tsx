import type { Context } from "hono";
import type { Child } from "hono/jsx";
import { ApiError, type Failure, type Result } from "../../errors";
import type { PageEnv } from "../context";
import { flashQuery, PostForm } from "../layout";

// What the vault page's sections (one module each in this folder; page.tsx puts them together)
// share: how a form is answered, a 303 back to the page's section with a flash (the service's own
// detail on failure) and the fields worth keeping (never a secret's value); and the pieces each
// section is drawn with (a titled section, its table, a one-button form, paging). The keys page
// answers its forms the same way.

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

// ---- drawing a section ----

/** Rows per section before it pages. */
const PAGE_SIZE = 100;

export const when = (d: Date) => `${d.toISOString().slice(0, 16).replace("T", " ")} UTC`;

export const plural = (n: number, one: string) => `${n} ${one}${n === 1 ? "" : "s"}`;

export function Section(props: { id: string; title: string; children?: Child }) {
  return (
    <section id={props.id}>
      <h2>{props.title}</h2>
      {props.children}
    </section>
  );
}

/** A column: its heading and its width class ("": it takes the rest). */
export type Column = readonly [heading: string, width: string];

/** A section's table: the columns' widths and headings, then the rows. */
export function Table(props: { columns: readonly Column[]; children?: Child }) {
  return (
    <table>
      <colgroup>{props.columns.map(([, width]) => (width ? <col class={width} /> : <col />))}</colgroup>
      <thead>
        <tr>
          {props.columns.map(([heading]) => (
            <th>{heading}</th>
          ))}
        </tr>
      </thead>
      <tbody>{props.children}</tbody>
    </table>
  );
}

/** A form that is one button (Delete, Allow, Up...), with the hidden fields it sends. */
export function ButtonForm(props: {
  action: string;
  csrf: string;
  label: string;
  hidden?: Record<string, string | undefined>;
  inline?: boolean;
  title?: string;
}) {
  return (
    <PostForm action={props.action} csrf={props.csrf} class={props.inline ? "inline" : undefined}>
      {Object.entries(props.hidden ?? {}).map(([name, value]) =>
        value ? <input type="hidden" name={name} value={value} /> : null,
      )}
      <button type="submit" title={props.title}>
        {props.label}
      </button>
    </PostForm>
  );
}

/** Offset paging over a list the service returns whole: `?{param}=N`. */
export function pageOf<T>(c: Ctx, items: readonly T[], param: string) {
  const raw = Number.parseInt(c.req.query(param) ?? "0", 10);
  const from = Number.isFinite(raw) && raw > 0 && raw < items.length ? raw : 0;
  return { rows: items.slice(from, from + PAGE_SIZE), from, total: items.length, param };
}

export function Pager(props: { from: number; total: number; param: string; anchor: string }) {
  if (props.total <= PAGE_SIZE) return null;
  const link = (from: number) => `${PAGE}?${props.param}=${from}#${props.anchor}`;
  const to = Math.min(props.from + PAGE_SIZE, props.total);
  return (
    <p class="muted">
      {`${props.from + 1}–${to} of ${props.total}. `}
      {props.from > 0 ? <a href={link(Math.max(props.from - PAGE_SIZE, 0))}>Previous</a> : null}{" "}
      {to < props.total ? <a href={link(to)}>Next</a> : null}
    </p>
  );
}
