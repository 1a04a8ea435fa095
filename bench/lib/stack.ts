import { randomBytes } from "node:crypto";
import { proxyNamespaces } from "../../local-agent/network";
import { whyNotRunnable } from "../../scripts/lib/can-isolate";
import { applyMigrations } from "../../scripts/lib/migrate";
import { configureNeonForNode, nodeDb } from "../../scripts/lib/neon-node";
import { findPostgresBin, startPostgresql } from "../../scripts/lib/postgres";
import { startWsBridge } from "../../scripts/lib/ws-bridge";
import { provisionApiKey } from "../../src/auth/provision";
import { randomId } from "../../src/crypto/api-keys";

// The control plane's parts for the benches that need them (audit ingest, run start), started
// the way the tests start them (test/setup/database.ts, test/e2e/harness.ts): a throwaway cluster
// of the machine's real PostgreSQL, the WebSocket bridge the Neon driver talks through, the
// committed migrations; tenants made by the provisioning code of `npm run create-user`.

export interface BenchDatabase {
  url: string;
  /** host:port of the WebSocket→TCP bridge (the Worker's DATABASE_WS_PROXY). */
  wsProxy: string;
  /** PostgreSQL's version, as the server says. */
  version: string;
  stop(): Promise<void>;
}

/** Why a bench that needs PostgreSQL cannot run here, or null. */
/**
 * Why a bench that runs real sandboxes on the local stack cannot run now, as the line it logs
 * before it skips (its section of bench/results stays as it was); null: it can.
 */
export function whyNoLocalRuns(bench: string): string | null {
  const why = whyNotRunnable() ?? whyNoPostgres();
  if (why) {
    return `${bench} skipped: ${why} (it makes namespaces). Its section of bench/results is left as it was.`;
  }
  // The host agent's nft table is the machine's: an agent that installs it while another agent's
  // run is live cuts that run off its relay. So never start beside another agent's runs.
  const others = proxyNamespaces();
  if (others.length > 0) {
    return (
      `${bench} skipped: another local agent has runs on this machine (${others.join(", ")}); ` +
      "two agents share the host's nft table. Run it when they are done."
    );
  }
  return null;
}

export function whyNoPostgres(): string | null {
  return findPostgresBin() ? null : "PostgreSQL is not installed (Debian: apt-get install postgresql)";
}

export async function startDatabase(): Promise<BenchDatabase> {
  const bin = findPostgresBin();
  if (!bin) throw new Error(whyNoPostgres() ?? "no PostgreSQL");
  const pg = await startPostgresql(bin);
  const bridge = await startWsBridge({ host: pg.host, port: pg.port });
  const stop = () => bridge.close().then(pg.stop);
  try {
    configureNeonForNode(bridge.address);
    await applyMigrations(pg.url);
    const { pool } = nodeDb(pg.url);
    const version = String((await pool.query("show server_version")).rows[0]?.server_version ?? "?");
    await pool.end();
    return { url: pg.url, wsProxy: bridge.address, version, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

/** A vault key ring of one fresh key, for this run only. */
export const newVaultKek = () => `bench1:${randomBytes(32).toString("base64")}`;

/** A user with an environment and an API key, as `npm run create-user` makes them. */
export async function newTenant(databaseUrl: string, tag: string) {
  const { db, pool } = nodeDb(databaseUrl);
  try {
    return await provisionApiKey(db, { email: `${randomId(`${tag}_`)}@bench.test`, keyName: "bench" });
  } finally {
    await pool.end();
  }
}

// What a bench started, stopped in reverse order when it ends: normally, on an error, or on ^C
// (wrangler dev runs in a process group of its own and PostgreSQL as another user: neither goes
// away with the bench by itself).
const stops: Array<() => Promise<unknown>> = [];

export function onStop(stop: () => Promise<unknown>): void {
  stops.push(stop);
}

export async function stopAll(): Promise<void> {
  for (const stop of stops.splice(0).reverse()) await stop().catch(() => {});
}

for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const)
  process.once(sig, () => void stopAll().finally(() => process.exit(130)));
