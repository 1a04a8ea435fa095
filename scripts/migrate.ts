// `npm run db:migrate`: applies the committed migrations to DATABASE_URL (e.g. a Neon database).
// Set DATABASE_WS_PROXY=host:port only for a local Postgres behind the WebSocket bridge.
import { applyMigrations } from "./lib/migrate";
import { configureNeonForNode } from "./lib/neon-node";

const url = process.env.DATABASE_URL;
if (!url) {
  console.error("DATABASE_URL is not set: point it at the Postgres (Neon) database to migrate.");
  process.exit(2);
}
configureNeonForNode(process.env.DATABASE_WS_PROXY || undefined);
await applyMigrations(url);
console.log("migrations applied");
