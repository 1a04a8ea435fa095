import type { ApiKeyScope } from "@benchwright/shared/contract/api-key-scope";

// What a key of each scope may do (case K3); the scopes themselves are the contract's
// (contract/api-key-scope.ts).

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
