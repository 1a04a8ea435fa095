import type { TestProject } from "vitest/node";
import { applyMigrations } from "../../scripts/lib/migrate";
import { configureNeonForNode } from "../../scripts/lib/neon-node";
import {
  findPostgresBin,
  type LocalPostgres,
  startPglite,
  startPostgresql,
} from "../../scripts/lib/postgres";
import { startWsBridge } from "../../scripts/lib/ws-bridge";

// Starts the database the workerd tests talk to: a throwaway cluster of the real PostgreSQL when
// it is installed (CI installs it), PGlite otherwise; a WebSocket→TCP bridge in front so the
// Worker uses the real Neon driver; then the committed migrations.
declare module "vitest" {
  export interface ProvidedContext {
    databaseUrl: string;
    databaseWsProxy: string;
    databaseKind: string;
    vaultKek: string;
  }
}

export default async function setup(project: TestProject) {
  const bin = findPostgresBin();
  const pg: LocalPostgres = bin ? await startPostgresql(bin) : await startPglite();
  if (!bin) console.warn("PostgreSQL is not installed; the worker tests run on PGlite instead.");
  const bridge = await startWsBridge({ host: pg.host, port: pg.port });
  configureNeonForNode(bridge.address);
  await applyMigrations(pg.url);
  const key = (n: number) => Buffer.alloc(32, n).toString("base64");
  project.provide("databaseUrl", pg.url);
  project.provide("databaseWsProxy", bridge.address);
  project.provide("databaseKind", pg.kind);
  // A test-only key ring with two keys, so rotation paths run in every route test.
  project.provide("vaultKek", `test2:${key(2)},test1:${key(1)}`);
  return async () => {
    await bridge.close();
    await pg.stop();
  };
}
