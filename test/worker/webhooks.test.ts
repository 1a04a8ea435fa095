import { eq } from "drizzle-orm";
import { Webhook } from "standardwebhooks";
import { afterEach, describe, expect, it, vi } from "vitest";
import { runs, webhookDeliveries, webhooks } from "../../src/db/schema";
import { WEBHOOK_SECRET } from "../../src/webhooks/signature";
import { type ApiResponse, BASE, call, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { findNeedles, leakNeedles, newCanary, responseText, scanDatabase } from "./leaks";

// Webhook-triggered runs against the real Worker and Postgres: registration and its secret
// (shown once), the public delivery endpoint's Standard Webhooks verification (cases D1, D2, D4),
// de-duplication by delivery id (D3), rotation, revocation, tenant isolation (C1, C3) and the
// secret's leak scan (B5). Deliveries are signed with the library senders use, then tampered.

const TEMPLATE = { commands: ["echo from-webhook"] };

interface Registered {
  t: Tenant;
  id: string;
  secret: string;
  url: string;
}

async function register(t?: Tenant, body: unknown = { name: "ci", run: TEMPLATE }): Promise<Registered> {
  const tenant = t ?? (await newTenant());
  const res = await tenant.api("POST", "/v1/webhooks", body);
  if (res.status !== 201) throw new Error(`register: ${res.status} ${res.text}`);
  return { t: tenant, id: res.json.id, secret: res.json.secret, url: res.json.url };
}

let counter = 0;
const newDeliveryId = () => `msg_${crypto.randomUUID().replaceAll("-", "")}${++counter}`;

interface Signed {
  headers: Record<string, string>;
  body: string;
}

/** A delivery as a Standard Webhooks sender makes it: id, timestamp (seconds), `v1,` signature. */
function sign(secret: string, opts: { id?: string; at?: Date; body?: string } = {}): Signed {
  const id = opts.id ?? newDeliveryId();
  const at = opts.at ?? new Date();
  const body = opts.body ?? JSON.stringify({ event: "push", ref: "main" });
  return {
    headers: {
      "webhook-id": id,
      "webhook-timestamp": String(Math.floor(at.getTime() / 1000)),
      "webhook-signature": new Webhook(secret).sign(id, at, body),
    },
    body,
  };
}

const deliver = (webhookId: string, d: Signed, headers: Record<string, string> = d.headers) =>
  call(null, "POST", `/hooks/${webhookId}`, d.body, headers);

const runCount = (t: Tenant) =>
  withDb(async (db) => (await db.select().from(runs).where(eq(runs.environmentId, t.environmentId))).length);

function expectStatus(res: ApiResponse, status: number, what = ""): ApiResponse {
  if (res.status !== status) throw new Error(`${what}: expected ${status}, got ${res.status} ${res.text}`);
  return res;
}

afterEach(() => {
  vi.restoreAllMocks();
});

describe("webhook registration", { timeout: 60_000 }, () => {
  it("POST /v1/webhooks → 201 with url and secret; GET and list never show the secret", async () => {
    const t = await newTenant();
    const res = expectStatus(await t.api("POST", "/v1/webhooks", { name: "ci", run: TEMPLATE }), 201);
    expect(res.json.id).toMatch(/^whk_/);
    expect(res.json.secret).toMatch(WEBHOOK_SECRET);
    expect(res.json.url).toBe(`${BASE}/hooks/${res.json.id}`);
    expect(res.json).toMatchObject({
      name: "ci",
      run: { ...TEMPLATE, egress: "direct", onProxyFailure: "stop" },
      rotatedAt: null,
      previousSecretExpiresAt: null,
    });
    const one = expectStatus(await t.api("GET", `/v1/webhooks/${res.json.id}`), 200);
    const { secret, ...shown } = res.json;
    expect(one.json).toEqual(shown);
    expect(one.text).not.toContain(secret);
    const list = expectStatus(await t.api("GET", "/v1/webhooks"), 200);
    expect(list.json).toEqual({ webhooks: [shown] });
    expect(list.text).not.toContain(secret);
    // Two webhooks never share a secret.
    const other = await register(t);
    expect(other.secret).not.toBe(secret);
  });

  it("refuses bad bodies with exact codes (C3: unknown fields, also inside the template)", async () => {
    const t = await newTenant();
    const post = (body: unknown) => t.api("POST", "/v1/webhooks", body);
    expectProblem(await post({ name: "x", run: TEMPLATE, userId: "usr_x" }), 400, "unknown_field");
    expectProblem(await post({ name: "x", run: TEMPLATE, secret: "whsec_x" }), 400, "unknown_field");
    expectProblem(
      await post({ name: "x", run: { ...TEMPLATE, environmentId: "env_x" } }),
      400,
      "unknown_field",
    );
    expectProblem(await post({ name: "x" }), 400, "invalid_request");
    expectProblem(await post({ name: "", run: TEMPLATE }), 400, "invalid_request");
    expectProblem(await post({ name: "x", run: {} }), 400, "invalid_request");
    expectProblem(
      await post({ name: "x", run: { commands: ["a"], benchmark: "demo" } }),
      400,
      "invalid_request",
    );
    expectProblem(await post({ name: "x", run: { benchmark: "nope" } }), 400, "unknown_benchmark");
    expectProblem(
      await t.api("POST", `/v1/webhooks/${(await register(t)).id}/rotate-secret`, { force: true }),
      400,
      "unknown_field",
    );
    expect((await t.api("GET", "/v1/webhooks")).json.webhooks).toHaveLength(1);
  });
});

describe("webhook deliveries", { timeout: 60_000 }, () => {
  it("a signed delivery → 202 with a run made from the template; the body is counted, not stored", async () => {
    const w = await register();
    const d = sign(w.secret);
    const res = expectStatus(await deliver(w.id, d), 202);
    expect(Object.keys(res.json)).toEqual(["runId"]);
    expect(res.json.runId).toMatch(/^run_/);
    const run = expectStatus(await w.t.api("GET", `/v1/runs/${res.json.runId}`), 200);
    expect(run.json.spec).toEqual({ ...TEMPLATE, egress: "direct", onProxyFailure: "stop" });
    expect(run.json.trace[0]).toMatchObject({ kind: "transition", state: "queued" });
    const rows = await withDb((db) =>
      db.select().from(webhookDeliveries).where(eq(webhookDeliveries.webhookId, w.id)),
    );
    expect(rows).toEqual([
      {
        webhookId: w.id,
        deliveryId: d.headers["webhook-id"],
        runId: res.json.runId,
        bodyBytes: new TextEncoder().encode(d.body).byteLength,
        receivedAt: expect.any(Date),
      },
    ]);
  });

  // case D1
  it("D1: missing, invalid or partial signature, missing id or timestamp, non-integer timestamp → 401", async () => {
    const w = await register();
    const other = await register();
    const d = sign(w.secret);
    const h = d.headers;
    const sig = h["webhook-signature"] as string;
    const ts = h["webhook-timestamp"] as string;
    const without = (name: string) => Object.fromEntries(Object.entries(h).filter(([k]) => k !== name));
    const flipped = `${sig.slice(0, 10)}${sig[10] === "A" ? "B" : "A"}${sig.slice(11)}`;
    // Signed with the real secret at a real time, but the header spells the time differently: the
    // library's parseInt would read the same number, so only a digits-only check refuses these.
    const at = new Date(Number(ts) * 1000);
    const signedAt = (spelled: string) => ({ ...h, "webhook-timestamp": spelled });
    const reSigned = sign(w.secret, { id: "msg.dotted", at, body: d.body });
    const cases: Record<string, Record<string, string>> = {
      "no headers": {},
      "no webhook-id": without("webhook-id"),
      "no webhook-timestamp": without("webhook-timestamp"),
      "no webhook-signature": without("webhook-signature"),
      "empty signature": { ...h, "webhook-signature": "" },
      "v1, and nothing": { ...h, "webhook-signature": "v1," },
      "flipped character": { ...h, "webhook-signature": flipped },
      "partial (half the signature)": { ...h, "webhook-signature": sig.slice(0, sig.length / 2) },
      "partial (last character missing)": { ...h, "webhook-signature": sig.slice(0, -1) },
      "no version": { ...h, "webhook-signature": sig.slice(3) },
      "another version": { ...h, "webhook-signature": `v2,${sig.slice(3)}` },
      "asymmetric version": { ...h, "webhook-signature": `v1a,${sig.slice(3)}` },
      "another webhook's secret": sign(other.secret, { id: h["webhook-id"], at, body: d.body }).headers,
      "another delivery id": { ...h, "webhook-id": newDeliveryId() },
      "another timestamp": { ...h, "webhook-timestamp": String(Number(ts) - 1) },
      "timestamp with letters": signedAt(`${ts}abc`),
      "timestamp as a float": signedAt(`${ts}.0`),
      "timestamp with a sign": signedAt(`+${ts}`),
      // (Leading and trailing spaces are not a case: HTTP strips them before anyone reads the value.)
      "timestamp, a space and more digits": signedAt(`${ts} 1`),
      "timestamp in exponent form": signedAt(`${Number(ts) / 1000}e3`),
      "timestamp in milliseconds": signedAt(`${ts}000`),
      "negative timestamp": signedAt("-1"),
      "id with a dot": reSigned.headers,
      "oversized signature header": { ...h, "webhook-signature": `${"v1,AAAA ".repeat(600)}${sig}` },
    };
    const failures: string[] = [];
    for (const [label, headers] of Object.entries(cases)) {
      const res = await deliver(w.id, d, headers);
      try {
        expectProblem(res, 401, "invalid_signature");
      } catch (e) {
        failures.push(`${label}: ${(e as Error).message}`);
      }
    }
    expect(failures).toEqual([]);
    expect(await runCount(w.t)).toBe(0);
    // The untampered delivery goes through: the refusals were for the tampering alone.
    expectStatus(await deliver(w.id, d), 202);
    expect(await runCount(w.t)).toBe(1);
  });

  // case D2
  it("D2: a timestamp more than 5 minutes old or ahead → 401; inside the window → accepted", async () => {
    const w = await register();
    const now = Date.now();
    for (const offset of [-6 * 60_000, 6 * 60_000, -3600_000, 86_400_000]) {
      const res = await deliver(w.id, sign(w.secret, { at: new Date(now + offset) }));
      expectProblem(res, 401, "invalid_signature");
    }
    expect(await runCount(w.t)).toBe(0);
    expectStatus(await deliver(w.id, sign(w.secret, { at: new Date(now - 4 * 60_000) })), 202);
    expectStatus(await deliver(w.id, sign(w.secret, { at: new Date(now + 4 * 60_000) })), 202);
    expect(await runCount(w.t)).toBe(2);
  });

  // case D3
  it("D3: a replayed delivery creates exactly one run; the replay is answered 200 with the same run", async () => {
    const w = await register();
    const d = sign(w.secret);
    const first = expectStatus(await deliver(w.id, d), 202);
    const again = expectStatus(await deliver(w.id, d), 200);
    expect(again.json).toEqual({ runId: first.json.runId });
    // A sender's retry: same delivery id, signed again at a later time.
    const retry = sign(w.secret, { id: d.headers["webhook-id"], body: d.body });
    expect(expectStatus(await deliver(w.id, retry), 200).json).toEqual({ runId: first.json.runId });
    expect(await runCount(w.t)).toBe(1);

    // Five at once: one 202, four 200, one run.
    const burst = sign(w.secret);
    const answers = await Promise.all(Array.from({ length: 5 }, () => deliver(w.id, burst)));
    const statuses = answers.map((a) => a.status).sort();
    expect(statuses, answers.map((a) => a.text).join("\n")).toEqual([200, 200, 200, 200, 202]);
    expect(new Set(answers.map((a) => a.json.runId)).size).toBe(1);
    expect(await runCount(w.t)).toBe(2);

    // Delivery ids are per webhook: another webhook may use the same one.
    const w2 = await register(w.t);
    const reused = sign(w2.secret, { id: d.headers["webhook-id"] });
    const res = expectStatus(await deliver(w2.id, reused), 202);
    expect(res.json.runId).not.toBe(first.json.runId);
  });

  // case D4
  it("D4: verified over the raw bytes; any one valid signature of several is enough", async () => {
    const w = await register();
    const body = JSON.stringify({ event: "push", ref: "main", n: 1 });
    const d = sign(w.secret, { body });
    // The same JSON, other bytes: whitespace, key order, escapes, a trailing newline.
    for (const reserialized of [
      JSON.stringify(JSON.parse(body), null, 2),
      JSON.stringify({ ref: "main", event: "push", n: 1 }),
      body.replace("main", "\\u006dain"),
      `${body}\n`,
      ` ${body}`,
    ]) {
      expectProblem(await deliver(w.id, { ...d, body: reserialized }), 401, "invalid_signature");
    }
    expect(await runCount(w.t)).toBe(0);

    const sig = d.headers["webhook-signature"] as string;
    const bad = `v1,${btoa("x".repeat(32))}`;
    const several = { ...d.headers, "webhook-signature": `${bad} v2,whatever ${sig}` };
    expectStatus(await deliver(w.id, d, several), 202);
    // Non-ASCII text is signed and checked as its UTF-8 bytes.
    expectStatus(await deliver(w.id, sign(w.secret, { body: '{"name":"café ☕ 𝄞"}' })), 202);
    expect(await runCount(w.t)).toBe(2);
  });

  // case D4 (several signatures during a rotation)
  it("D4 rotation: the previous secret verifies for 24 h, alone or beside the new one; not after", async () => {
    const w = await register();
    const before = Date.now();
    const rotated = expectStatus(await w.t.api("POST", `/v1/webhooks/${w.id}/rotate-secret`), 200);
    const fresh = rotated.json.secret as string;
    expect(fresh).toMatch(WEBHOOK_SECRET);
    expect(fresh).not.toBe(w.secret);
    const expires = Date.parse(rotated.json.previousSecretExpiresAt);
    expect(expires).toBeGreaterThanOrEqual(before + 24 * 3600_000 - 1000);
    expect(expires).toBeLessThanOrEqual(Date.now() + 24 * 3600_000 + 1000);
    const read = expectStatus(await w.t.api("GET", `/v1/webhooks/${w.id}`), 200);
    expect(read.json.previousSecretExpiresAt).toBe(rotated.json.previousSecretExpiresAt);
    expect(read.text).not.toContain(fresh);
    expect(read.text).not.toContain(w.secret);

    expectStatus(await deliver(w.id, sign(w.secret)), 202);
    expectStatus(await deliver(w.id, sign(fresh)), 202);
    // A sender rolling over signs with both.
    const both = sign(fresh);
    const old = sign(w.secret, { id: both.headers["webhook-id"], body: both.body });
    both.headers["webhook-signature"] =
      `${old.headers["webhook-signature"]} ${both.headers["webhook-signature"]}`;
    expectStatus(await deliver(w.id, both), 202);

    // The window lapses.
    await withDb((db) =>
      db
        .update(webhooks)
        .set({ previousSecretExpiresAt: new Date(Date.now() - 1000) })
        .where(eq(webhooks.id, w.id)),
    );
    expectProblem(await deliver(w.id, sign(w.secret)), 401, "invalid_signature");
    expectStatus(await deliver(w.id, sign(fresh)), 202);
    expectStatus(await deliver(w.id, both, both.headers), 200);

    // A second rotation: the first secret is gone at once, the second becomes the previous one.
    const third = expectStatus(await w.t.api("POST", `/v1/webhooks/${w.id}/rotate-secret`, {}), 200).json
      .secret as string;
    expectProblem(await deliver(w.id, sign(w.secret)), 401, "invalid_signature");
    expectStatus(await deliver(w.id, sign(fresh)), 202);
    expectStatus(await deliver(w.id, sign(third)), 202);
  });

  it("an unknown or revoked webhook → 404, even with a valid signature; revoking drops the secret", async () => {
    const w = await register();
    expectProblem(await deliver("whk_nope", sign(w.secret)), 404, "not_found");
    const d = sign(w.secret);
    expectStatus(await deliver(w.id, d), 202);
    expectStatus(await w.t.api("DELETE", `/v1/webhooks/${w.id}`), 204);
    expectProblem(await deliver(w.id, sign(w.secret)), 404, "not_found");
    // Even a replay of an accepted delivery.
    expectProblem(await deliver(w.id, d), 404, "not_found");
    expectProblem(await w.t.api("GET", `/v1/webhooks/${w.id}`), 404, "not_found");
    expectProblem(await w.t.api("DELETE", `/v1/webhooks/${w.id}`), 404, "not_found");
    expectProblem(await w.t.api("POST", `/v1/webhooks/${w.id}/rotate-secret`), 404, "not_found");
    expect((await w.t.api("GET", "/v1/webhooks")).json.webhooks).toEqual([]);
    const [row] = await withDb((db) => db.select().from(webhooks).where(eq(webhooks.id, w.id)));
    expect(row).toMatchObject({ secretCiphertext: null, previousSecretCiphertext: null });
    expect(row?.revokedAt).toBeInstanceOf(Date);
  });

  it("a body above 64 KiB → 413 payload_too_large, no run", async () => {
    const w = await register();
    const big = sign(w.secret, { body: JSON.stringify({ pad: "x".repeat(64 * 1024) }) });
    expectProblem(await deliver(w.id, big), 413, "payload_too_large");
    expect(await runCount(w.t)).toBe(0);
  });

  it("a delivery needs no API key, and an API key does not replace the signature", async () => {
    const w = await register();
    const res = await call(w.t.key, "POST", `/hooks/${w.id}`, "{}", {});
    expectProblem(res, 401, "invalid_signature");
    expectProblem(await call(null, "GET", `/hooks/${w.id}`), 404, "route_not_found");
  });
});

describe("C1 another tenant's webhook is a 404", { timeout: 60_000 }, () => {
  it("B cannot read, list, revoke or rotate A's webhook; A's keeps working with its secret", async () => {
    const a = await register();
    const b = await newTenant();
    const before = await withDb((db) => db.select().from(webhooks).where(eq(webhooks.id, a.id)));
    expectProblem(await b.api("GET", `/v1/webhooks/${a.id}`), 404, "not_found");
    expectProblem(await b.api("DELETE", `/v1/webhooks/${a.id}`), 404, "not_found");
    expectProblem(await b.api("POST", `/v1/webhooks/${a.id}/rotate-secret`), 404, "not_found");
    const list = expectStatus(await b.api("GET", "/v1/webhooks"), 200);
    expect(list.json.webhooks).toEqual([]);
    expect(list.text).not.toContain(a.id);
    expect(await withDb((db) => db.select().from(webhooks).where(eq(webhooks.id, a.id)))).toEqual(before);
    const res = expectStatus(await deliver(a.id, sign(a.secret)), 202);
    // The run is A's.
    expectStatus(await a.t.api("GET", `/v1/runs/${res.json.runId}`), 200);
    expectProblem(await b.api("GET", `/v1/runs/${res.json.runId}`), 404, "not_found");
  });
});

describe("B5 the signing secret and the delivery body never leak", { timeout: 120_000 }, () => {
  it("no log line, later response or database plaintext holds the secret (or a body canary)", async () => {
    const lines: string[] = [];
    for (const level of ["log", "info", "warn", "error", "debug", "trace"] as const) {
      vi.spyOn(console, level).mockImplementation((...args: unknown[]) => {
        lines.push(`${level}: ${args.map((a) => (typeof a === "string" ? a : JSON.stringify(a))).join(" ")}`);
      });
    }
    const w = await register();
    const rotated = expectStatus(await w.t.api("POST", `/v1/webhooks/${w.id}/rotate-secret`), 200);
    const fresh = rotated.json.secret as string;
    const later: [string, ApiResponse][] = [];
    const keep = (where: string, res: ApiResponse) => {
      later.push([where, res]);
      return res;
    };
    const bodyCanary = newCanary("webhookbody");
    const good = sign(fresh, { body: JSON.stringify({ token: bodyCanary }) });
    keep("fresh delivery", expectStatus(await deliver(w.id, good), 202));
    keep("replay", expectStatus(await deliver(w.id, good), 200));
    keep("old secret", expectStatus(await deliver(w.id, sign(w.secret, { body: bodyCanary })), 202));
    const tampered = { ...good.headers, "webhook-signature": "v1,AAAA" };
    keep("bad signature", expectProblem(await deliver(w.id, good, tampered), 401, "invalid_signature"));
    keep(
      "old",
      expectProblem(await deliver(w.id, sign(fresh, { at: new Date(0) })), 401, "invalid_signature"),
    );
    keep("unknown", expectProblem(await deliver("whk_nope", good), 404, "not_found"));
    keep("GET", expectStatus(await w.t.api("GET", `/v1/webhooks/${w.id}`), 200));
    keep("list", expectStatus(await w.t.api("GET", "/v1/webhooks"), 200));
    const runId = later[0]?.[1].json.runId;
    keep("run", expectStatus(await w.t.api("GET", `/v1/runs/${runId}`), 200));
    keep("document", expectStatus(await call(null, "GET", "/v1/openapi.json"), 200));

    const needles = [
      ...(await Promise.all([w.secret, fresh, bodyCanary].map(leakNeedles))).flat(),
      // The key bytes' own base64 (after `whsec_`), in either alphabet.
      ...[w.secret, fresh].flatMap((s) => {
        const b64 = s.slice("whsec_".length).replace(/=+$/, "");
        return [b64, b64.replaceAll("+", "-").replaceAll("/", "_")];
      }),
    ];
    expect(lines.flatMap((line, i) => findNeedles(`log line ${i}`, line, needles))).toEqual([]);
    expect(later.flatMap(([where, res]) => findNeedles(where, responseText(res), needles))).toEqual([]);
    const db = await scanDatabase(needles);
    expect(db.columns).toContain("public.webhooks.secret_ciphertext");
    expect(db.columns).toContain("public.webhooks.previous_secret_ciphertext");
    expect(db.hits).toEqual([]);
    // The scan does see webhook rows: the delivery id is stored in plaintext.
    const control = await scanDatabase([good.headers["webhook-id"] as string]);
    expect(control.hits.map((h) => h.where)).toContain("public.webhook_deliveries.delivery_id");
  });
});
