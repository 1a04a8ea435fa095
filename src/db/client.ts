import { neonConfig, Pool } from "@neondatabase/serverless";
import { drizzle } from "drizzle-orm/neon-serverless";
import * as schema from "./schema";

import type { Db } from "./types";

export type { Db };

// Bounded so a dead or slow database turns into a 503 quickly instead of a hung request (E7).
const CONNECT_TIMEOUT_MS = 5_000;

/** Where the database is: the Worker's Config has these two settings (src/config.ts). */
export interface DbSettings {
  readonly databaseUrl: string;
  /** Local bridge host:port; undefined means real Neon over wss. */
  readonly databaseWsProxy: string | undefined;
}

/**
 * A database handle for one request. Workers cannot keep sockets between requests, so each
 * request gets its own pool, closed when the request is done.
 */
export function openDb(config: DbSettings): { db: Db; close: () => Promise<void> } {
  if (config.databaseWsProxy) {
    // Local development and tests: plain ws:// to a WebSocket→TCP bridge in front of Postgres.
    const proxy = config.databaseWsProxy;
    neonConfig.wsProxy = (host, port) => `${proxy}/v2?address=${host}:${port}`;
    neonConfig.useSecureWebSocket = false;
    neonConfig.pipelineConnect = false;
    neonConfig.pipelineTLS = false;
  }
  const pool = new Pool({
    connectionString: config.databaseUrl,
    max: 1,
    connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
  });
  pool.on("error", () => {}); // an idle client's socket error must not crash the isolate
  return { db: drizzle({ client: pool, schema }), close: () => pool.end() };
}
