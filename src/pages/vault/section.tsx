import type { Child } from "hono/jsx";
import { PostForm } from "../layout";
import { type Ctx, PAGE } from "./forms";

// What the vault page's sections are drawn with: a titled section, its table of rows, a cell of
// code, a form that is one button, and paging over a list the service returns whole.

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

/**
 * A section's list: its empty text when there are no rows, else a table, a row an item. `head`
 * names the columns, `widths` gives each its width class ("": it takes the rest).
 */
export function Table<T>(props: {
  rows: readonly T[];
  empty: string;
  head: readonly string[];
  widths: readonly string[];
  row: (item: T, index: number) => Child;
}) {
  if (props.rows.length === 0) return <p class="empty">{props.empty}</p>;
  return (
    <table>
      <colgroup>{props.widths.map((width) => (width ? <col class={width} /> : <col />))}</colgroup>
      <thead>
        <tr>
          {props.head.map((heading) => (
            <th>{heading}</th>
          ))}
        </tr>
      </thead>
      <tbody>{props.rows.map((item, i) => props.row(item, i))}</tbody>
    </table>
  );
}

/** A cell of code: a name, a host, a fingerprint. */
export function CodeCell(props: { text: string }) {
  return (
    <td>
      <code>{props.text}</code>
    </td>
  );
}

/** The cell of a row's Delete button. */
export function DeleteCell(props: { action: string; csrf: string }) {
  return (
    <td>
      <ButtonForm action={props.action} csrf={props.csrf} label="Delete" />
    </td>
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

/** A host entry's or rule's limits in a cell: methods, then paths; a dash for none. */
export function LimitsCell(props: { methods: readonly string[] | null; paths: readonly string[] | null }) {
  if (props.methods === null && props.paths === null) {
    return (
      <td>
        <span class="muted">—</span>
      </td>
    );
  }
  return (
    <td>
      {props.methods ? <code>{props.methods.join(" ")}</code> : null}
      {props.methods && props.paths ? " " : null}
      {props.paths ? <code>{props.paths.join(" ")}</code> : null}
    </td>
  );
}
