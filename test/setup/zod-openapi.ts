// Loaded before every worker test file (vitest `setupFiles`). zod 4 gives a schema its
// prototype's methods when the schema is made, so a shared contract schema made before
// @hono/zod-openapi has extended zod has no `.openapi`, and the route modules that document it
// then fail to load. The Worker's entry loads its routes first; a test file may import a
// contract module first, so the extension comes first here, for every file.
import "@hono/zod-openapi";
