// What an API key may do (case K3). One table: the database column, the API's schema, the
// middleware and the pages all read it from here.
//   full: everything the environment allows.
//   read: GET and HEAD only — the smallest scope still worth having (a dashboard, a CI job
//         that only watches runs). Every other method is refused with 403 read_only_key.
export const API_KEY_SCOPES = ["read", "full"] as const;
export type ApiKeyScope = (typeof API_KEY_SCOPES)[number];

/** Methods a read key may use: the ones that change nothing. */
const READ_METHODS = new Set(["GET", "HEAD"]);

/** Whether a key of this scope may make a request with this method. */
export const scopeAllows = (scope: ApiKeyScope, method: string): boolean =>
  scope === "full" || READ_METHODS.has(method.toUpperCase());

/** Whether a key of scope `have` may make a key of scope `want` (never a wider one). */
export const scopeCovers = (have: ApiKeyScope, want: ApiKeyScope): boolean =>
  have === "full" || want === "read";

/** The methods that need a full key, as the OpenAPI document spells them. */
export const WRITE_METHODS_LOWER = ["post", "put", "patch", "delete"] as const;
