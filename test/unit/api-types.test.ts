import { readFileSync } from "node:fs";
import { expect, it } from "vitest";
import { API_TYPES, apiTypesSource } from "../../scripts/openapi";

// The CLI's client types are generated from the API's OpenAPI document and committed; a route
// that changes shape must regenerate them (npm run openapi), so the CLI's typecheck sees it.
it("cli/src/api-types.ts matches the OpenAPI document createApp() serves", async () => {
  expect(readFileSync(API_TYPES, "utf8") === (await apiTypesSource()), "run npm run openapi").toBe(true);
}, 60_000);
