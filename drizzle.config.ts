import { defineConfig } from "drizzle-kit";

// Migrations are generated (`npm run db:generate`), committed, and applied by scripts/migrate.ts in
// dev, tests and CI alike; never `drizzle-kit push`.
export default defineConfig({
  dialect: "postgresql",
  schema: "./src/db/schema/index.ts",
  out: "./migrations",
});
