import { createServer, type Socket } from "node:net";
import type { TestProject } from "vitest/node";
import { applyMigrations } from "../../scripts/lib/migrate";
import { configureNeonForNode } from "../../scripts/lib/neon-node";
import { startEmbeddedPostgres } from "../../scripts/lib/pglite-bridge";
import { findPostgresBin, startPostgresql } from "../../scripts/lib/postgres";
import { startWsBridge } from "../../scripts/lib/ws-bridge";

// Starts the database the workerd tests talk to: a throwaway cluster of the real PostgreSQL when
// it is installed (CI installs it), PGlite otherwise; a WebSocket→TCP bridge in front so the
// Worker uses the real Neon driver; then the committed migrations.
declare module "vitest" {
  export interface ProvidedContext {
    databaseUrl: string;
    databaseWsProxy: string;
    databaseKind: string;
    /** The same database as a role that signs in only with SCRAM-SHA-256 (null on PGlite). */
    databaseScramUrl: string | null;
    vaultKek: string;
    silentAddress: string;
  }
}

export default async function setup(project: TestProject) {
  const bin = findPostgresBin();
  let db: { kind: string; url: string; scramUrl?: string | null; wsProxy: string; stop: () => Promise<void> };
  if (bin) {
    const pg = await startPostgresql(bin, { signIn: "password" });
    const bridge = await startWsBridge({ host: pg.host, port: pg.port });
    db = {
      kind: pg.kind,
      url: pg.url,
      scramUrl: pg.scramUrl,
      wsProxy: bridge.address,
      stop: () => bridge.close().then(pg.stop),
    };
  } else {
    console.warn("PostgreSQL is not installed; the worker tests run on PGlite instead.");
    db = await startEmbeddedPostgres();
  }
  const pg = db;
  configureNeonForNode(db.wsProxy);
  await applyMigrations(db.url);
  const key = (n: number) => Buffer.alloc(32, n).toString("base64");
  project.provide("databaseUrl", db.url);
  project.provide("databaseWsProxy", db.wsProxy);
  project.provide("databaseKind", pg.kind);
  project.provide("databaseScramUrl", pg.scramUrl ?? null);
  // A test-only key ring with two keys, so rotation paths run in every route test.
  project.provide("vaultKek", `test2:${key(2)},test1:${key(1)}`);
  const silent = await startSilentServer();
  project.provide("silentAddress", silent.address);
  return async () => {
    await silent.close();
    await pg.stop();
  };
}

/**
 * A loopback TCP endpoint that accepts connections and never says a word: a database (or proxy)
 * that hangs, so tests can prove a request is bounded by the connect timeout (case E7).
 */
async function startSilentServer(): Promise<{ address: string; close: () => Promise<void> }> {
  const held = new Set<Socket>();
  const server = createServer((socket) => {
    held.add(socket);
    socket.on("error", () => {});
    socket.on("close", () => held.delete(socket));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  const { port } = server.address() as { port: number };
  return {
    address: `127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of held) s.destroy();
        server.close(() => resolve());
      }),
  };
}
