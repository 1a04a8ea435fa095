// One problem+json body (RFC 9457) for the API and the host agent alike: each has its own closed
// set of codes with one status and one title each; the shape of the body is this one.

/** A closed code set's statuses and titles: one entry per code. */
export interface ProblemTable<C extends string> {
  status: Record<C, number>;
  title: Record<C, string>;
}

export interface ProblemBody<C extends string> {
  type: string;
  title: string;
  status: number;
  detail: string;
  code: C;
}

export function problemBodyOf<C extends string>(
  table: ProblemTable<C>,
  code: C,
  detail: string,
): ProblemBody<C> {
  return {
    type: `https://benchwright.dev/problems/${code}`,
    title: table.title[code],
    status: table.status[code],
    detail,
    code,
  };
}
