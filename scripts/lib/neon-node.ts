import { neonConfig, Pool } from "@neondatabase/serverless";
import { drizzle } from "drizzle-orm/neon-serverless";
import * as schema from "../../src/db/schema";
import { WebSocket } from "./node-ws";

// Node-side database access (migrations, user creation, test factories) goes through the same
// Neon driver as the Worker, so local and cloud paths share one code path.
export function configureNeonForNode(wsProxy: string | undefined): void {
  neonConfig.webSocketConstructor = WebSocket;
  if (wsProxy) {
    neonConfig.wsProxy = (host, port) => `${wsProxy}/v2?address=${host}:${port}`;
    neonConfig.useSecureWebSocket = false;
    neonConfig.pipelineConnect = false;
    neonConfig.pipelineTLS = false;
  }
}

export function nodeDb(databaseUrl: string) {
  const pool = new Pool({ connectionString: databaseUrl, max: 4 });
  return { db: drizzle({ client: pool, schema }), pool };
}
