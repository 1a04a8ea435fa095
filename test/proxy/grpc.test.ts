import {
  type Client,
  credentials,
  Metadata,
  makeGenericClientConstructor,
  Server,
  ServerCredentials,
  type ServerDuplexStream,
  type ServerUnaryCall,
  type ServerWritableStream,
  type ServiceError,
  type sendUnaryData,
  status,
} from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestCa, type RunningProxy, startProxy, type TestCa, vault } from "./harness";

// Case I1 with a real gRPC client and server (@grpc/grpc-js both ends): gRPC is HTTP/2 end to end,
// bodies streamed both ways and its status in trailers. Through the proxy to a rule host, the
// credential goes in as metadata (a header of the stream), and whatever the server echoes of it,
// in a message, in initial metadata or in trailers, comes back masked.

const CANARY = "sk-canary-grpc-2b8f6e41d9";
const MASKED = `Bearer ${"*".repeat(CANARY.length)}`;

interface Msg {
  [k: string]: unknown;
}
const json = {
  serialize: (v: Msg) => Buffer.from(JSON.stringify(v)),
  deserialize: (b: Buffer) => JSON.parse(b.toString()) as Msg,
};
const method = (name: string, responseStream: boolean, requestStream = false) => ({
  path: `/bw.test.Echo/${name}`,
  requestStream,
  responseStream,
  requestSerialize: json.serialize,
  requestDeserialize: json.deserialize,
  responseSerialize: json.serialize,
  responseDeserialize: json.deserialize,
});
/** A service without a .proto: JSON messages, which is all a test of the transport needs. */
const ECHO = {
  Unary: method("Unary", false),
  Count: method("Count", true),
  Fail: method("Fail", false),
  Chat: method("Chat", true, true),
};

let ca: TestCa;
let proxy: RunningProxy;
let server: Server;
/** The metadata each call arrived with at the server. */
const seen: Array<{ call: string; authorization: string | undefined }> = [];
let client: Client & Record<string, (...args: unknown[]) => unknown>;

const authOf = (md: Metadata) => md.get("authorization")[0]?.toString();

beforeAll(async () => {
  ca = await createTestCa();
  const leaf = await ca.issue(["grpc.test"]);
  server = new Server();
  server.addService(ECHO, {
    Unary(call: ServerUnaryCall<Msg, Msg>, callback: sendUnaryData<Msg>) {
      const auth = authOf(call.metadata);
      seen.push({ call: "Unary", authorization: auth });
      const initial = new Metadata();
      initial.set("x-echo-auth", auth ?? "");
      call.sendMetadata(initial);
      const trailer = new Metadata();
      trailer.set("x-trailer-auth", auth ?? "");
      callback(null, { hello: call.request.name, auth }, trailer);
    },
    Count(call: ServerWritableStream<Msg, Msg>) {
      const auth = authOf(call.metadata);
      seen.push({ call: "Count", authorization: auth });
      const n = Number(call.request.n);
      let i = 0;
      // One message at a time, each after the previous one was written: a streamed response.
      const next = () => {
        if (i === n) {
          const trailer = new Metadata();
          trailer.set("x-count", String(n));
          return void call.end(trailer);
        }
        call.write({ i: i++, auth }, () => setImmediate(next));
      };
      next();
    },
    Chat(call: ServerDuplexStream<Msg, Msg>) {
      const auth = authOf(call.metadata);
      seen.push({ call: "Chat", authorization: auth });
      call.on("data", (m: Msg) => call.write({ re: m.say, auth }));
      call.on("end", () => call.end());
    },
    Fail(call: ServerUnaryCall<Msg, Msg>, callback: sendUnaryData<Msg>) {
      seen.push({ call: "Fail", authorization: authOf(call.metadata) });
      // An error before any message: gRPC's trailers-only answer, its status in the one HEADERS.
      callback({ code: status.NOT_FOUND, details: `no such thing (you sent ${authOf(call.metadata)})` });
    },
  });
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync(
      "127.0.0.2:0",
      ServerCredentials.createSsl(null, [
        { cert_chain: Buffer.from(leaf.certPem), private_key: Buffer.from(leaf.keyPem) },
      ]),
      (e, p) => (e ? reject(e) : resolve(p)),
    ),
  );
  proxy = await startProxy({
    vault: vault({
      rules: [{ host: "grpc.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } }],
    }),
    secrets: { API_KEY: CANARY },
    routes: { "grpc.test": { address: "127.0.0.2", port } },
    upstreamCa: ca,
  });
  // The work sandbox's client: grpc.test:443 redirected to the proxy, trusting only the run CA.
  const Ctor = makeGenericClientConstructor(ECHO, "Echo");
  client = new Ctor(`127.0.0.1:${proxy.tlsPort}`, credentials.createSsl(Buffer.from(proxy.caPem)), {
    "grpc.ssl_target_name_override": "grpc.test",
    "grpc.default_authority": "grpc.test",
  }) as typeof client;
});

afterAll(async () => {
  expect(JSON.stringify(proxy.logs)).not.toContain(CANARY);
  expect(JSON.stringify(proxy.audit)).not.toContain(CANARY);
  client.close();
  await proxy.close();
  await new Promise<void>((resolve) => server.tryShutdown(() => resolve()));
});

interface Outcome {
  messages: Msg[];
  headers: Record<string, unknown>;
  trailers: Record<string, unknown>;
  code: number;
  details: string;
}

/** One call; gathers messages, initial metadata, the status and its trailing metadata. */
function call(name: keyof typeof ECHO, request: Msg, withAgentKey = false): Promise<Outcome> {
  return new Promise((resolve) => {
    const out: Outcome = { messages: [], headers: {}, trailers: {}, code: -1, details: "" };
    const md = new Metadata();
    if (withAgentKey) md.set("authorization", "Bearer agent-supplied");
    const onStatus = (s: { code: number; details: string; metadata: Metadata }) => {
      out.code = s.code;
      out.details = s.details;
      out.trailers = s.metadata.getMap();
      resolve(out);
    };
    if (ECHO[name].responseStream) {
      const stream = client[name]?.(request, md) as NodeJS.EventEmitter;
      stream.on("metadata", (m: Metadata) => {
        out.headers = m.getMap();
      });
      stream.on("data", (m: Msg) => out.messages.push(m));
      stream.on("error", () => {});
      stream.on("status", onStatus);
    } else {
      const c = client[name]?.(request, md, (_e: ServiceError | null, m?: Msg) => {
        if (m) out.messages.push(m);
      }) as NodeJS.EventEmitter;
      c.on("metadata", (m: Metadata) => {
        out.headers = m.getMap();
      });
      c.on("status", onStatus);
    }
  });
}

describe("case I1: gRPC through the proxy to a rule host", () => {
  it("a unary call: the credential goes in as metadata, every echo of it comes back masked", async () => {
    const r = await call("Unary", { name: "bench" }, true);
    expect(r.code).toBe(status.OK);
    // The server got the vault's credential in place of the agent's.
    expect(seen.at(-1)).toEqual({ call: "Unary", authorization: `Bearer ${CANARY}` });
    // In the message (length-prefixed protobuf framing survives: masking keeps the length)...
    expect(r.messages).toEqual([{ hello: "bench", auth: MASKED }]);
    // ...in initial metadata, and in the trailers that carry the status.
    expect(r.headers["x-echo-auth"]).toBe(MASKED);
    expect(r.trailers["x-trailer-auth"]).toBe(MASKED);
    expect(JSON.stringify(r)).not.toContain(CANARY);
    const rec = await proxy.waitForLog((l) => l.event === "decision" && l.host === "grpc.test");
    expect(rec).toMatchObject({
      method: "POST",
      status: 200,
      rule: 0,
      reason: "allowed, credential injected",
    });
  });

  it("a server-streaming call: every message arrives, then the status and trailers", async () => {
    const r = await call("Count", { n: 5 });
    expect(r.code).toBe(status.OK);
    expect(r.messages).toEqual([0, 1, 2, 3, 4].map((i) => ({ i, auth: MASKED })));
    expect(r.trailers["x-count"]).toBe("5");
    expect(seen.at(-1)).toEqual({ call: "Count", authorization: `Bearer ${CANARY}` });
  });

  it("a bidirectional call, each answer awaited before the next message: nothing is held back", async () => {
    const chat = client.Chat?.(new Metadata()) as NodeJS.EventEmitter & {
      write(m: Msg): void;
      end(): void;
    };
    const answers: Msg[] = [];
    const next = () => new Promise<Msg>((resolve) => chat.once("data", resolve));
    const done = new Promise<number>((resolve) =>
      chat.once("status", (s: { code: number }) => resolve(s.code)),
    );
    for (const say of ["one", "two", "three"]) {
      const answer = next();
      chat.write({ say });
      // The masked answer must arrive whole while the call stays open, not when the next one comes.
      answers.push(await answer);
    }
    chat.end();
    expect(await done).toBe(status.OK);
    expect(answers).toEqual(["one", "two", "three"].map((say) => ({ re: say, auth: MASKED })));
    expect(seen.at(-1)).toEqual({ call: "Chat", authorization: `Bearer ${CANARY}` });
  });

  it("an error status (trailers-only answer) reaches the client with its details masked", async () => {
    const r = await call("Fail", {});
    expect(r.code).toBe(status.NOT_FOUND);
    expect(r.details).toBe(`no such thing (you sent ${MASKED})`);
    expect(r.messages).toEqual([]);
  });

  it("calls on one channel share one HTTP/2 connection, each stream decided and recorded", async () => {
    const from = proxy.logs.length;
    const all = await Promise.all([
      call("Unary", { name: "a" }),
      call("Count", { n: 2 }),
      call("Unary", { name: "b" }),
    ]);
    expect(all.map((r) => r.code)).toEqual([status.OK, status.OK, status.OK]);
    const records = proxy.logs.slice(from).filter((l) => l.event === "decision");
    expect(records).toHaveLength(3);
    expect(new Set(records.map((l) => l.conn)).size).toBe(1);
    for (const l of records) expect(l).toMatchObject({ host: "grpc.test", rule: 0, status: 200 });
  });
});
