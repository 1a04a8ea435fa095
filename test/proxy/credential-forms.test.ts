import { randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { ModelLaneSpec } from "@benchwright/shared/contract/policy";
import { createAddressPolicy } from "@benchwright/shared/node/address-policy";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { modelLane } from "../../proxy-image/src/proxy/model/lane";
import { needlesFor } from "../../proxy-image/src/proxy/redact";
import { createUpstream } from "../../proxy-image/src/proxy/upstream";
import {
  createTestCa,
  curlTls,
  type RunningProxy,
  startProxy,
  startTlsUpstream,
  type TestCa,
  type Upstream,
  vault,
} from "./harness";

// Case I9: the credential is masked in every form, by one function (needlesFor) for the main path
// and the model lane. One real TLS upstream answers both: its body and headers carry the key raw,
// as injected, URL-encoded, JSON-escaped and `\/`-escaped, written one byte per chunk so every
// form straddles chunk boundaries (the hold-back rule, case B7). The key has `/`, `"`, `\` and
// `+` in it, so each form is a different byte string.

const CANARY = `sk-i9/"can\\ary"+=${randomBytes(6).toString("hex")}`;
const json = JSON.stringify(CANARY).slice(1, -1);
const FORMS: Record<string, string> = {
  raw: CANARY,
  injected: `Bearer ${CANARY}`,
  url: encodeURIComponent(CANARY),
  form: new URLSearchParams([["k", CANARY]]).toString().slice(2),
  json,
  slash: json.replaceAll("/", "\\/"),
  injectedJson: JSON.stringify(`Bearer ${CANARY}`).slice(1, -1),
};
const BODY = `${Object.entries(FORMS)
  .map(([name, form]) => `|${name}=${form}`)
  .join("")}|end`;
const SPEC: ModelLaneSpec = {
  name: "bench-model",
  provider: "openai",
  baseUrl: "https://api.model.test/v1",
  upstreamModel: "fake-model",
  secret: "MODEL_KEY",
  budget: null,
};

/** Writes `text` one byte per chunk, each on its own turn of the event loop. */
async function trickle(res: ServerResponse, text: string): Promise<void> {
  for (const byte of Buffer.from(text, "latin1")) {
    res.write(Buffer.from([byte]));
    await new Promise((resolve) => setImmediate(resolve));
  }
  res.end();
}

function echoForms(req: IncomingMessage, res: ServerResponse, body: string): void {
  const sse = body.includes('"stream":true');
  res.writeHead(200, {
    "content-type": sse ? "text/event-stream" : "application/json",
    "x-echo-raw": CANARY,
    "x-echo-json": FORMS.json as string,
    "x-echo-url": FORMS.url as string,
  });
  void trickle(res, sse ? `data: ${BODY}\n\n` : BODY);
  void req;
}

let ca: TestCa;
let upstream: Upstream;
let proxy: RunningProxy;
let laneUpstream: ReturnType<typeof createUpstream>;
let front: Server;
let anthropicFront: Server;

beforeAll(async () => {
  ca = await createTestCa();
  upstream = await startTlsUpstream({ ca, hosts: ["forms.test", "api.model.test"], handler: echoForms });
  proxy = await startProxy({
    vault: vault({
      hosts: [{ pattern: "forms.test", action: "allow" }],
      rules: [{ host: "forms.test", secret: "KEY", inject: { scheme: "bearer", name: "authorization" } }],
    }),
    secrets: { KEY: CANARY },
    routes: { "forms.test": upstream },
    upstreamCa: ca,
  });
  // The model lane as the proxy runs it, in front of the same upstream.
  laneUpstream = createUpstream({
    addressPolicy: createAddressPolicy({ allowCidrs: ["127.0.0.2/32"] }),
    extraCaPem: ca.certPem,
    testRoutes: new Map([["api.model.test", { address: upstream.address, port: upstream.port }]]),
  });
  const lane = modelLane({ upstream: laneUpstream, log: () => {} });
  front = createServer((req, res) => void lane(req, res, req.url ?? "/", { spec: SPEC, secret: CANARY }));
  await new Promise<void>((resolve) => front.listen(0, "127.0.0.1", resolve));
  // The same for a provider the key goes to as x-api-key (Anthropic's Messages, passed through).
  const anthropic = { spec: { ...SPEC, provider: "anthropic" as const }, secret: CANARY };
  anthropicFront = createServer((req, res) => void lane(req, res, req.url ?? "/", anthropic));
  await new Promise<void>((resolve) => anthropicFront.listen(0, "127.0.0.1", resolve));
});

afterAll(async () => {
  for (const server of [front, anthropicFront]) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
  await laneUpstream.closeAll();
  await proxy.close();
  await upstream.close();
});

async function viaModelLane(stream: boolean, format: "openai" | "anthropic" = "openai") {
  const server = format === "openai" ? front : anthropicFront;
  const path = format === "openai" ? "/v1/chat/completions" : "/v1/messages";
  const res = await fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: "Bearer placeholder" },
    body: JSON.stringify({ model: "bench-model", messages: [], ...(stream ? { stream: true } : {}) }),
  });
  return { status: res.status, headers: [...res.headers].join("\n"), body: await res.text() };
}

function expectMasked(seen: string, what: string): void {
  for (const [name, form] of Object.entries(FORMS)) expect(seen, `${what}: ${name}`).not.toContain(form);
  expect(seen, what).not.toContain(CANARY.slice(0, 12));
}

describe("case I9: every form of the credential is masked, on both paths", () => {
  it("case I9: needlesFor gives both paths every form", () => {
    const forms = needlesFor(CANARY, `Bearer ${CANARY}`).map((b) => b.toString("latin1"));
    for (const form of Object.values(FORMS)) expect(forms).toContain(form);
  });

  it("case I9: the main path masks each form in the body and headers, across 1-byte chunks", async () => {
    const res = await curlTls(proxy, "https://forms.test/", ["-i"]);
    expect(res.status).toBe(200);
    expectMasked(res.body, "main path");
    const body = res.body.slice(res.body.indexOf("\r\n\r\n") + 4);
    // Same length, separators intact: only the credential's bytes became `*`.
    expect(body.length).toBe(BODY.length);
    expect(body).toMatch(
      /^\|raw=\*+\|injected=Bearer \*+\|url=\*+\|form=\*+\|json=\*+\|slash=\*+\|injectedJson=Bearer \*+\|end$/,
    );
  });

  it("case I9: the model lane masks the same forms, in a body and in a stream", async () => {
    const plain = await viaModelLane(false);
    expect(plain.status).toBe(200);
    expectMasked(`${plain.headers}\n${plain.body}`, "model lane body");
    const main = await curlTls(proxy, "https://forms.test/");
    // One function: the two paths turn the same bytes into the same bytes.
    expect(plain.body).toBe(main.body);
    const streamed = await viaModelLane(true);
    expect(streamed.status).toBe(200);
    expectMasked(`${streamed.headers}\n${streamed.body}`, "model lane stream");
    expect(streamed.body).toBe(`data: ${main.body}\n\n`);
  });

  it("case I9: the model lane masks them for a provider sent the key as x-api-key too", async () => {
    for (const stream of [false, true]) {
      const res = await viaModelLane(stream, "anthropic");
      expect(res.status).toBe(200);
      expectMasked(`${res.headers}\n${res.body}`, `anthropic lane, stream ${stream}`);
    }
    const sent = upstream.seen.filter((s) => s.url === "/v1/messages");
    expect(sent.map((s) => [s.headers["x-api-key"] === CANARY, s.headers.authorization])).toEqual([
      [true, undefined],
      [true, undefined],
    ]);
  });
});
