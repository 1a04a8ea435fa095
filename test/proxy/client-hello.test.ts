import { createServer, type Socket } from "node:net";
import { connect as tlsConnect } from "node:tls";
import { beforeAll, describe, expect, it } from "vitest";
import { parseClientHello, readClientHello } from "../../proxy-image/src/proxy/handler/client-hello";

// The splice decision's parser (case I3): the first flight of real clients, and hand-built
// ClientHellos for each way one can be malformed or misleading. Anything not accepted is
// terminated instead of spliced, so "invalid" is the safe answer and "done" must be exact.

/** The first flight node:tls sends, caught by a plain TCP server that answers nothing. */
async function capture(options: { servername?: string; ALPNProtocols?: string[] }): Promise<Buffer> {
  let socket: Socket | undefined;
  const server = createServer((s) => {
    socket = s;
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as { port: number }).port;
  try {
    const client = tlsConnect({ host: "127.0.0.1", port, ...options });
    client.on("error", () => {});
    while (!socket) await new Promise((r) => setImmediate(r));
    const read = await readClientHello(socket, 5_000);
    client.destroy();
    expect(read.parse.status).toBe("done");
    return read.bytes;
  } finally {
    socket?.destroy();
    server.close();
  }
}

const u16 = (n: number) => Buffer.from([n >> 8, n & 255]);
const vec2 = (b: Buffer) => Buffer.concat([u16(b.length), b]);
const serverName = (...names: Array<[number, string]>) =>
  vec2(
    Buffer.concat(names.map(([type, name]) => Buffer.concat([Buffer.from([type]), vec2(Buffer.from(name))]))),
  );

/** A ClientHello with the given extensions, in records of at most `recordSize` bytes. */
function hello(
  extensions: Array<[number, Buffer]> | null,
  recordSize = 16_384,
  trailing = Buffer.alloc(0),
): Buffer {
  const body = Buffer.concat([
    Buffer.from([3, 3]),
    Buffer.alloc(32, 7),
    Buffer.from([0]), // session id
    vec2(Buffer.from([0x13, 0x01])),
    Buffer.from([1, 0]), // compression: null
    extensions === null
      ? Buffer.alloc(0)
      : vec2(Buffer.concat(extensions.map(([t, d]) => Buffer.concat([u16(t), vec2(d)])))),
  ]);
  const message = Buffer.concat([Buffer.from([1, 0, body.length >> 8, body.length & 255]), body, trailing]);
  const records: Buffer[] = [];
  for (let at = 0; at < message.length; at += recordSize) {
    const part = message.subarray(at, at + recordSize);
    records.push(Buffer.concat([Buffer.from([0x16, 3, 1]), u16(part.length), part]));
  }
  return Buffer.concat(records);
}

describe("case I3: the ClientHello parser behind the splice decision", () => {
  let real: Buffer;
  let noSni: Buffer;
  beforeAll(async () => {
    real = await capture({ servername: "splice.test", ALPNProtocols: ["h2", "http/1.1"] });
    noSni = await capture({}); // connecting to an IP: node sends no SNI
  });

  it("reads the SNI of a real node:tls ClientHello, and nothing before it is whole", () => {
    expect(parseClientHello(real)).toEqual({ status: "done", sni: "splice.test", ech: false });
    for (let cut = 0; cut < real.length; cut++) {
      expect(parseClientHello(real.subarray(0, cut)).status).toBe("more");
    }
  });

  it("a real ClientHello without SNI has none", () => {
    expect(parseClientHello(noSni)).toEqual({ status: "done", sni: null, ech: false });
  });

  it("reassembles a ClientHello cut into many records", () => {
    const one = hello([[0, serverName([0, "frag.test"])]]);
    const many = hello([[0, serverName([0, "frag.test"])]], 7);
    expect(many.length).toBeGreaterThan(one.length);
    expect(parseClientHello(many)).toEqual({ status: "done", sni: "frag.test", ech: false });
  });

  it("flags an encrypted ClientHello (ECH, ESNI): its visible name is not the host it wants", () => {
    for (const type of [0xfe0d, 0xffce]) {
      expect(
        parseClientHello(
          hello([
            [0, serverName([0, "public.test"])],
            [type, Buffer.from([1, 2, 3])],
          ]),
        ),
      ).toEqual({ status: "done", sni: "public.test", ech: true });
    }
  });

  const invalid: Array<[string, Buffer]> = [
    [
      "two server_name extensions",
      hello([
        [0, serverName([0, "a.test"])],
        [0, serverName([0, "b.test"])],
      ]),
    ],
    ["two names in one list", hello([[0, serverName([0, "a.test"], [0, "b.test"])]])],
    ["a name of another type", hello([[0, serverName([1, "a.test"])]])],
    ["a name with a NUL", hello([[0, serverName([0, "a.test\u0000.evil.test"])]])],
    ["a name with non-ASCII bytes", hello([[0, serverName([0, "ä.test"])]])],
    ["an empty name", hello([[0, serverName([0, ""])]])],
    ["a server_name list longer than its extension", hello([[0, Buffer.from([0, 9, 0, 0, 1, 97])]])],
    [
      "data after the ClientHello in its record",
      hello([[0, serverName([0, "a.test"])]], 16_384, Buffer.from([0])),
    ],
    ["an application-data record", Buffer.from([0x17, 3, 3, 0, 1, 0])],
    ["plain HTTP", Buffer.from("GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")],
    ["a zero-length record", Buffer.from([0x16, 3, 1, 0, 0])],
    ["a ServerHello", Buffer.from([0x16, 3, 3, 0, 4, 2, 0, 0, 0])],
  ];
  for (const [what, bytes] of invalid) {
    it(`refuses ${what} (never spliced)`, () => {
      expect(parseClientHello(bytes).status).toBe("invalid");
    });
  }

  it("accepts a TLS 1.2 ClientHello with no extensions at all, as having no SNI", () => {
    expect(parseClientHello(hello(null))).toEqual({ status: "done", sni: null, ech: false });
  });
});
