import type { AddressInfo } from "node:net";
import { WebSocketServer } from "./node-ws";

// The embedded database for `npm start` (and the tests where PostgreSQL is not installed):
// PGlite, reached by the Neon driver over a WebSocket, as Neon's cloud is. PGlite is one Postgres
// session, so every client shares it; this bridge makes that safe under concurrency:
//   - a client's extended-protocol run (Parse/Bind/Describe/Execute ... up to Sync), a simple
//     Query, or its start-up runs as one unit, never interleaved with another client's;
//   - a client that opens a transaction keeps the session until it ends it (or disconnects,
//     which rolls it back).
// Hand-written because @electric-sql/pglite-socket interleaves clients message by message
// (a Parse of one between the Bind and Execute of another), which hangs the Worker as soon as
// the coordinator, the broker and the proxy's polls talk to the database at once.

export interface EmbeddedPostgres {
  kind: "pglite";
  /** A connection string for the driver; host and port are ignored by the bridge. */
  url: string;
  /** host:port of the bridge, for the driver's `wsProxy`. */
  wsProxy: string;
  stop: () => Promise<void>;
}

const SSL_REQUEST = 80877103;
const CANCEL_REQUEST = 80877102;
const GSSENC_REQUEST = 80877104;
// Messages after which the client waits for an answer: the end of a unit of work.
const UNIT_ENDS = new Set(["S", "Q", "H", "p", "F"].map((c) => c.charCodeAt(0)));
const TERMINATE = "X".charCodeAt(0);
/** Largest message a client may send; a larger length, or one the protocol cannot have, closes it. */
const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;

/** A FIFO mutex whose holder is a connection: it may keep it across several units (a transaction). */
class SessionLock {
  private holder: object | null = null;
  private readonly waiting: Array<{ owner: object; grant: () => void }> = [];

  async acquire(owner: object): Promise<void> {
    if (this.holder === owner) return;
    if (this.holder === null) {
      this.holder = owner;
      return;
    }
    await new Promise<void>((grant) => this.waiting.push({ owner, grant }));
  }

  release(owner: object): void {
    if (this.holder !== owner) return;
    const next = this.waiting.shift();
    this.holder = next?.owner ?? null;
    next?.grant();
  }

  holds(owner: object): boolean {
    return this.holder === owner;
  }
}

export async function startEmbeddedPostgres(dataDir?: string): Promise<EmbeddedPostgres> {
  const { PGlite } = await import("@electric-sql/pglite");
  const db = await PGlite.create(dataDir ? { dataDir } : {});
  const lock = new SessionLock();
  const wss = new WebSocketServer({ host: "127.0.0.1", port: 0 });

  wss.on("connection", (ws) => {
    const me = {};
    let buffer = Buffer.alloc(0);
    let started = false;
    let unit: Uint8Array[] = [];
    let work = Promise.resolve();
    let closed = false;

    const send = (bytes: Uint8Array) => {
      if (!closed && bytes.length > 0) ws.send(bytes);
    };
    // Units run one after another per connection, each under the session lock.
    const run = (messages: Uint8Array[]) => {
      work = work.then(async () => {
        if (closed) return;
        await lock.acquire(me);
        try {
          for (const message of messages) send(await db.execProtocolRaw(message));
        } finally {
          if (!db.isInTransaction()) lock.release(me);
        }
      });
      work = work.catch(() => ws.terminate());
    };

    ws.on("message", (data: Buffer) => {
      buffer = Buffer.concat([buffer, data]);
      for (;;) {
        if (!started) {
          if (buffer.length < 8) return;
          const length = buffer.readInt32BE(0);
          // A length the protocol cannot have would loop forever (0) or buffer without end.
          if (length < 8 || length > MAX_MESSAGE_BYTES) return void ws.terminate();
          if (buffer.length < length) return;
          const code = buffer.readInt32BE(4);
          const message = buffer.subarray(0, length);
          buffer = buffer.subarray(length);
          if (code === SSL_REQUEST || code === GSSENC_REQUEST) {
            send(Buffer.from("N")); // no TLS on loopback; the driver goes on in the clear
            continue;
          }
          if (code === CANCEL_REQUEST) continue;
          started = true;
          run([new Uint8Array(message)]);
          continue;
        }
        if (buffer.length < 5) return;
        const length = 1 + buffer.readInt32BE(1);
        if (length < 5 || length > MAX_MESSAGE_BYTES) return void ws.terminate();
        if (buffer.length < length) return;
        const type = buffer[0] as number;
        const message = new Uint8Array(buffer.subarray(0, length));
        buffer = buffer.subarray(length);
        if (type === TERMINATE) {
          ws.close();
          return;
        }
        unit.push(message);
        if (UNIT_ENDS.has(type)) {
          run(unit);
          unit = [];
        }
      }
    });
    ws.on("close", () => {
      closed = true;
      // A transaction left open by a client that went away is rolled back, and the session freed.
      work = work.then(async () => {
        if (!lock.holds(me)) return;
        if (db.isInTransaction()) await db.exec("ROLLBACK").catch(() => {});
        lock.release(me);
      });
    });
    ws.on("error", () => ws.terminate());
  });
  await new Promise<void>((resolve, reject) => {
    wss.once("listening", resolve);
    wss.once("error", reject);
  });
  const { port } = wss.address() as AddressInfo;
  return {
    kind: "pglite",
    url: "postgres://postgres:benchwright-local@pglite.local:5432/postgres",
    wsProxy: `127.0.0.1:${port}`,
    stop: async () => {
      for (const c of wss.clients) c.terminate();
      await new Promise<void>((r) => wss.close(() => r()));
      await db.close();
    },
  };
}
