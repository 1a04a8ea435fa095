// Method and path limits (cases N3, N4): which requests a limited host entry or rule lets
// through. The limits' grammar is policy.ts's (HttpMethod, PathLimit); this module says how a
// request is held to them. Pure: the proxy, the dry run and the vault pages share it.

/** Whether an entry or rule carries any limit (a limited host is always terminated, N3). */
export const hasLimits = (x: { methods?: readonly string[] | null; paths?: readonly string[] | null }) =>
  (x.methods ?? null) !== null || (x.paths ?? null) !== null;

/** Which limit a refused request was outside; an unnormalisable path is refused whatever the limit (N4). */
export const LIMIT_KINDS = ["method", "path", "unnormalisable_path"] as const;
export type LimitKindName = (typeof LIMIT_KINDS)[number];
