// One problem+json body (RFC 9457) for the API and the host agent alike: each has its own closed
// set of codes with one status and one title each; the shape of the body is this one.

/** A closed code set's statuses and titles: one entry per code. */
export interface ProblemTable<C extends string> {
  status: Record<C, number>;
  title: Record<C, string>;
}

/** A ProblemTable from one entry per code: `code: [status, title]`. */
export function problemTable<C extends string>(
  entries: Record<C, readonly [number, string]>,
): ProblemTable<C> {
  const rows = Object.entries(entries) as [C, readonly [number, string]][];
  return {
    status: Object.fromEntries(rows.map(([c, [status]]) => [c, status])) as Record<C, number>,
    title: Object.fromEntries(rows.map(([c, [, title]]) => [c, title])) as Record<C, string>,
  };
}

export interface ProblemBody<C extends string> {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: C;
}

/**
 * The body for `code`. Its `type` is `<typeBase>/problems/<code>`: the Worker passes its own
 * origin, which serves that page (src/pages/problems.tsx); the host agent serves none.
 */
export function problemBodyOf<C extends string>(
  table: ProblemTable<C>,
  code: C,
  detail: string,
  typeBase = "https://benchwright.dev",
): ProblemBody<C> {
  return {
    type: `${typeBase}/problems/${code}`,
    title: table.title[code],
    status: table.status[code],
    detail,
    code,
  };
}
