// What an API key may do (case K3), as a plain list: the one spelling of it. The database column
// (db/schema/accounts.ts), the API's schema, the middleware (src/auth/scope.ts) and the pages all
// read it from here.
//   full: everything the environment allows.
//   read: GET and HEAD only — the smallest scope still worth having (a dashboard, a CI job
//         that only watches runs). Every other method is refused with 403 read_only_key.
export const API_KEY_SCOPES = ["read", "full"] as const;
export type ApiKeyScope = (typeof API_KEY_SCOPES)[number];
