import { sql } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WebSocket } from "ws";
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

  it("closes a connection whose message length the protocol cannot have, and serves the others", async () => {
    const params = Buffer.from("user\0postgres\0database\0postgres\0\0");
    const startup = Buffer.alloc(8);
    startup.writeInt32BE(8 + params.length, 0);
    startup.writeInt32BE(196_608, 4); // protocol 3.0
    // A length below the 4 bytes of the length itself (here -1): no message can have it.
    const query = Buffer.from([0x51, 0xff, 0xff, 0xff, 0xff]);
    for (const bytes of [Buffer.alloc(8), Buffer.concat([startup, params, query])]) {
      const ws = new WebSocket(`ws://${pg.wsProxy}`);
      await new Promise((resolve) => ws.once("open", resolve));
      const closed = new Promise((resolve) => ws.once("close", resolve));
      ws.send(bytes);
      await closed;
    }
    const b = nodeDb(pg.url);
    expect((await b.db.execute(sql`select 1 as one`)).rows[0]).toEqual({ one: 1 });
    await b.pool.end();
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
