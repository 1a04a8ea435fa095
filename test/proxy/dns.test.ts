import { createSocket, type Socket as UdpSocket } from "node:dgram";
import { Resolver } from "node:dns/promises";
import { connect, type Socket } from "node:net";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConfigError, loadProxyConfig } from "../../proxy-image/src/proxy/config";
import { answerQuery, type CatchAllResolver, startCatchAllResolver } from "../../proxy-image/src/proxy/dns";

// The catch-all resolver over real UDP and TCP sockets on loopback. Node's own resolver (c-ares)
// is the client where it can be; hand-built packets check the exact bytes and the drops.

const ANSWER = "198.18.0.1";

/** A standard query, byte by byte (independent of the code under test). */
function query(
  id: number,
  name: string,
  opts: { type?: number; cls?: number; flags?: number; counts?: [number, number, number, number] } = {},
): Buffer {
  const labels = name === "" ? [] : name.split(".");
  const qname = Buffer.concat([
    ...labels.map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l, "latin1")])),
    Buffer.from([0]),
  ]);
  const [qd, an, ns, ar] = opts.counts ?? [1, 0, 0, 0];
  const head = Buffer.alloc(12);
  head.writeUInt16BE(id, 0);
  head.writeUInt16BE(opts.flags ?? 0x0100, 2); // RD set, as stub resolvers send it
  head.writeUInt16BE(qd, 4);
  head.writeUInt16BE(an, 6);
  head.writeUInt16BE(ns, 8);
  head.writeUInt16BE(ar, 10);
  const tail = Buffer.alloc(4);
  tail.writeUInt16BE(opts.type ?? 1, 0);
  tail.writeUInt16BE(opts.cls ?? 1, 2);
  return Buffer.concat([head, qname, tail]);
}

/** An EDNS(0) OPT pseudo-record (RFC 6891), as many clients append to a query. */
const OPT = Buffer.from([0, 0x00, 0x29, 0x10, 0x00, 0, 0, 0, 0, 0, 0]);

interface Client {
  socket: UdpSocket;
  next(): Promise<Buffer>;
  send(msg: Buffer): Promise<void>;
  close(): void;
}

async function udpClient(port: number): Promise<Client> {
  const socket = createSocket("udp4");
  const inbox: Buffer[] = [];
  const waiting: Array<(b: Buffer) => void> = [];
  socket.on("message", (m: Buffer) => {
    const w = waiting.shift();
    if (w) w(m);
    else inbox.push(m);
  });
  await new Promise<void>((r) => socket.bind(0, "127.0.0.1", () => r()));
  return {
    socket,
    next: () => {
      const m = inbox.shift();
      return m ? Promise.resolve(m) : new Promise((r) => waiting.push(r));
    },
    send: (msg) =>
      new Promise((resolve, reject) =>
        socket.send(msg, port, "127.0.0.1", (e) => (e ? reject(e) : resolve())),
      ),
    close: () => socket.close(),
  };
}

let resolver: CatchAllResolver;
let client: Resolver;

beforeAll(async () => {
  resolver = await startCatchAllResolver({ host: "127.0.0.1", port: 0, answer: ANSWER, log: () => {} });
  client = new Resolver({ timeout: 2_000, tries: 1 });
  client.setServers([`127.0.0.1:${resolver.port}`]);
});
afterAll(async () => {
  await resolver.close();
});

describe("the catch-all resolver, asked by Node's resolver over UDP", () => {
  it("answers every A query with the configured address, TTL 5", async () => {
    for (const name of ["api.example.com", "evil.test", "x.y.z.internal", "localhost", "a-b_c.invalid"]) {
      expect(await client.resolve4(name, { ttl: true })).toEqual([{ address: ANSWER, ttl: 5 }]);
    }
  });

  it("answers AAAA and other types with NOERROR and no records", async () => {
    await expect(client.resolve6("api.example.com")).rejects.toMatchObject({ code: "ENODATA" });
    await expect(client.resolveMx("example.com")).rejects.toMatchObject({ code: "ENODATA" });
    await expect(client.resolveTxt("example.com")).rejects.toMatchObject({ code: "ENODATA" });
  });
});

describe("the exact reply", () => {
  let c: Client;
  beforeAll(async () => {
    c = await udpClient(resolver.port);
  });
  afterAll(() => c.close());

  it("is a response to that id, authoritative, RD echoed, RA clear, question echoed in its case", async () => {
    const q = query(0xbeef, "ApI.ExAmPlE.cOm");
    await c.send(q);
    const r = await c.next();
    expect(r.readUInt16BE(0)).toBe(0xbeef);
    expect(r.readUInt16BE(2)).toBe(0x8000 | 0x0400 | 0x0100); // QR AA RD, NOERROR
    expect([r.readUInt16BE(4), r.readUInt16BE(6), r.readUInt16BE(8), r.readUInt16BE(10)]).toEqual([
      1, 1, 0, 0,
    ]);
    expect(r.subarray(12, q.length)).toEqual(q.subarray(12));
    // C00C (name → question), A, IN, TTL 5, 4 bytes, 198.18.0.1
    expect(r.subarray(q.length).toString("hex")).toBe("c00c00010001000000050004c6120001");
  });

  it("answers a query carrying an EDNS OPT record (and does not echo the OPT)", async () => {
    const q = Buffer.concat([query(7, "edns.test", { counts: [1, 0, 0, 1] }), OPT]);
    await c.send(q);
    const r = await c.next();
    expect(r.readUInt16BE(0)).toBe(7);
    expect(r.readUInt16BE(6)).toBe(1);
    expect(r.readUInt16BE(10)).toBe(0);
  });

  it("gives no record for an A query outside class IN, and NOERROR", async () => {
    await c.send(query(8, "version.bind", { cls: 3 }));
    const r = await c.next();
    expect(r.readUInt16BE(2) & 0x000f).toBe(0);
    expect(r.readUInt16BE(6)).toBe(0);
  });

  const malformed: Array<[string, Buffer]> = [
    ["shorter than a header", Buffer.from([1, 2, 3, 4, 5])],
    ["a response (QR set)", query(1, "loop.test", { flags: 0x8100 })],
    ["another opcode (STATUS)", query(1, "op.test", { flags: 0x1100 })],
    ["two questions", query(1, "two.test", { counts: [2, 0, 0, 0] })],
    ["no question", query(1, "none.test", { counts: [0, 0, 0, 0] })],
    ["an answer section in a query", query(1, "an.test", { counts: [1, 1, 0, 0] })],
    [
      "a compression pointer in the question",
      Buffer.concat([query(1, "").subarray(0, 12), Buffer.from([0xc0, 0x0c, 0, 1, 0, 1])]),
    ],
    [
      "a reserved label type",
      Buffer.concat([query(1, "").subarray(0, 12), Buffer.from([0x41, 0x61, 0, 0, 1, 0, 1])]),
    ],
    [
      "a label running past the end",
      Buffer.concat([query(1, "").subarray(0, 12), Buffer.from([0x3f, 0x61, 0x62])]),
    ],
    ["no type and class", query(1, "cut.test").subarray(0, -4)],
    ["a name longer than 255 bytes", query(1, Array.from({ length: 5 }, () => "a".repeat(63)).join("."))],
    [
      "a datagram over 4096 bytes",
      Buffer.concat([query(1, "big.test", { counts: [1, 0, 0, 1] }), Buffer.alloc(5000)]),
    ],
  ];

  it.each(malformed)("drops %s without a reply", async (_name, bad) => {
    // The resolver handles datagrams in order: if the bad one were answered, that reply would
    // arrive before the good one's.
    await c.send(bad);
    await c.send(query(0x4242, "after.test"));
    expect((await c.next()).readUInt16BE(0)).toBe(0x4242);
  });

  it("a name of exactly 255 bytes is still answered", async () => {
    // 3 × 63-byte labels + one 61-byte label: 4 length bytes + 250 + root = 255.
    const name = [..."abc"]
      .map((ch) => ch.repeat(63))
      .concat("d".repeat(61))
      .join(".");
    await c.send(query(9, name));
    expect((await c.next()).readUInt16BE(6)).toBe(1);
  });
});

describe("answerQuery on arbitrary bytes", () => {
  it("never throws, and a reply is only ever to the same id and at most 16 bytes more than the query", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 600 }), (bytes) => {
        const r = answerQuery(bytes, ANSWER);
        if (r === null) return;
        expect(r.readUInt16BE(0)).toBe(Buffer.from(bytes).readUInt16BE(0));
        expect(r.length).toBeLessThanOrEqual(bytes.length + 16);
        expect(r.readUInt8(2) & 0x80).toBe(0x80);
      }),
      { numRuns: 2_000 },
    );
  });
});

describe("over TCP", () => {
  function tcpExchange(
    payload: Buffer,
    wantReplies: number,
  ): Promise<{ replies: Buffer[]; closed: boolean }> {
    return new Promise((resolve, reject) => {
      const s: Socket = connect(resolver.port, "127.0.0.1");
      let buf = Buffer.alloc(0);
      const replies: Buffer[] = [];
      s.on("data", (d: Buffer) => {
        buf = Buffer.concat([buf, d]);
        while (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
          replies.push(buf.subarray(2, 2 + buf.readUInt16BE(0)));
          buf = buf.subarray(2 + buf.readUInt16BE(0));
        }
        if (replies.length >= wantReplies && wantReplies > 0) {
          s.destroy();
          resolve({ replies, closed: false });
        }
      });
      s.on("close", () => resolve({ replies, closed: true }));
      s.on("error", reject);
      s.write(payload);
    });
  }
  const framed = (m: Buffer) => Buffer.concat([Buffer.from([m.length >> 8, m.length & 0xff]), m]);

  it("answers length-framed queries, several pipelined in one write", async () => {
    const { replies } = await tcpExchange(
      Buffer.concat([framed(query(1, "one.test")), framed(query(2, "two.test", { type: 28 }))]),
      2,
    );
    expect(replies.map((r) => [r.readUInt16BE(0), r.readUInt16BE(6)])).toEqual([
      [1, 1],
      [2, 0],
    ]);
  });

  it("closes the connection on a malformed message, after answering what came before it", async () => {
    const { replies, closed } = await tcpExchange(
      Buffer.concat([framed(query(3, "ok.test")), framed(query(4, "bad.test", { flags: 0x8000 }))]),
      0,
    );
    expect(closed).toBe(true);
    expect(replies.map((r) => r.readUInt16BE(0))).toEqual([3]);
  });

  it("closes the connection when a message claims more than 4096 bytes", async () => {
    const { replies, closed } = await tcpExchange(Buffer.from([0xff, 0xff, 0, 0]), 0);
    expect(closed).toBe(true);
    expect(replies).toEqual([]);
  });
});

describe("configuration", () => {
  const base = {
    BW_RUN_ID: "run_dns",
    BW_CONTROL_PLANE_URL: "http://127.0.0.1:1",
    BW_PROXY_TOKEN: "t".repeat(32),
    BW_AUDIT_KEY: "whsec_x",
  };

  it("is off unless BW_DNS_PORT is set; the answer defaults to 198.18.0.1", () => {
    const c = loadProxyConfig(base, []);
    expect(c.BW_DNS_PORT).toBeUndefined();
    expect(c.BW_DNS_ANSWER).toBe("198.18.0.1");
    expect(loadProxyConfig({ ...base, BW_DNS_PORT: "5353" }, ["--dns-answer", "10.232.1.1"])).toMatchObject({
      BW_DNS_PORT: 5353,
      BW_DNS_ANSWER: "10.232.1.1",
    });
  });

  it("refuses an answer that is not an IPv4 address, naming the setting", () => {
    expect(() => loadProxyConfig({ ...base, BW_DNS_ANSWER: "::1" }, [])).toThrow(ConfigError);
    expect(() => loadProxyConfig({ ...base, BW_DNS_ANSWER: "::1" }, [])).toThrow(
      "BW_DNS_ANSWER (--dns-answer): must be an IPv4 address",
    );
  });
});
