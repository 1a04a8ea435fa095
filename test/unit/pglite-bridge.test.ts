import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { configureNeonForNode, nodeDb } from "../../scripts/lib/neon-node";
import { type EmbeddedPostgres, startEmbeddedPostgres } from "../../scripts/lib/pglite-bridge";

// The embedded database behind `npm start`: many clients of the real Neon driver at once, each
// with its own connection, extended-protocol queries and transactions, over the one PGlite
// session. Every answer must be the client's own, and nothing may hang.
describe("embedded Postgres bridge", () => {
  let pg: EmbeddedPostgres;
  beforeAll(async () => {
    pg = await startEmbeddedPostgres();
    configureNeonForNode(pg.wsProxy);
  });
  afterAll(async () => {
    await pg.stop();
  });

  it("serves 40 concurrent clients, each in its own transactions, with answers that are their own", async () => {
    const setup = nodeDb(pg.url);
    await setup.db.execute(sql`create table if not exists bridge_t (client int, n int)`);
    await setup.pool.end();
    const clients = Array.from({ length: 40 }, async (_, client) => {
      const { db, pool } = nodeDb(pg.url);
      try {
        for (let n = 0; n < 5; n++) {
          await db.transaction(async (tx) => {
            await tx.execute(sql`insert into bridge_t values (${client}, ${n})`);
            const seen = await tx.execute(
              sql`select count(*)::int as c from bridge_t where client = ${client}`,
            );
            expect(seen.rows[0]).toEqual({ c: n + 1 });
          });
          const echo = await db.execute(sql`select ${`client-${client}-${n}`}::text as v`);
          expect(echo.rows[0]).toEqual({ v: `client-${client}-${n}` });
        }
      } finally {
        await pool.end();
      }
    });
    await Promise.all(clients);
    const check = nodeDb(pg.url);
    const total = await check.db.execute(sql`select count(*)::int as c from bridge_t`);
    expect(total.rows[0]).toEqual({ c: 200 });
    await check.pool.end();
  });

  it("rolls back a transaction whose client went away, and frees the session for the others", async () => {
    const a = nodeDb(pg.url);
    await a.db.execute(sql`create table if not exists bridge_r (v int)`);
    const client = await a.pool.connect();
    await client.query("begin");
    await client.query("insert into bridge_r values (1)");
    // The connection drops mid-transaction (the socket closes without a COMMIT).
    client.release(new Error("gone"));
    await a.pool.end();
    const b = nodeDb(pg.url);
    const rows = await b.db.execute(sql`select count(*)::int as c from bridge_r`);
    expect(rows.rows[0]).toEqual({ c: 0 });
    await b.pool.end();
  });
});
