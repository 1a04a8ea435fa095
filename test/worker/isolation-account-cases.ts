import { eq } from "drizzle-orm";
import { expect, inject } from "vitest";
import { notifications, webhooks } from "../../src/db/schema";
import { call, expectProblem, withDb } from "./harness";
import {
  type Body,
  type Case,
  type Check,
  type Ctx,
  expectStatus,
  keyRows,
  type Vault,
} from "./isolation-fixtures";

// The isolation cases of what a tenant sets up around its runs: API keys, webhooks,
// notification URLs, and the two routes that are not tenant-scoped on purpose (the caller's own
// key, the OpenAPI document): one per operation, merged into the table of the whole document in
// isolation-cases.ts; isolation-account.test.ts runs them.

/** A tenant's webhook rows in the database, ciphertexts included. */
async function webhookRows(v: Vault) {
  return withDb((db) =>
    db.select().from(webhooks).where(eq(webhooks.environmentId, v.t.environmentId)).orderBy(webhooks.id),
  );
}

/** A tenant's notification rows in the database, ciphertexts included. */
async function notificationRows(v: Vault) {
  return withDb((db) =>
    db
      .select()
      .from(notifications)
      .where(eq(notifications.environmentId, v.t.environmentId))
      .orderBy(notifications.id),
  );
}

/** One kind of a tenant's own things: where they are, which one each tenant has, its rows. */
interface Owned {
  path: string;
  /** The field a list of them answers under. */
  key: string;
  idOf: (v: Vault) => string;
  rows: (v: Vault) => Promise<unknown[]>;
}

const KEYS: Owned = { path: "/v1/api-keys", key: "apiKeys", idOf: (v) => v.t.keyId, rows: keyRows };
const WEBHOOKS: Owned = {
  path: "/v1/webhooks",
  key: "webhooks",
  idOf: (v) => v.webhookId,
  rows: webhookRows,
};
const NOTIFICATIONS: Owned = {
  path: "/v1/notifications",
  key: "notifications",
  idOf: (v) => v.notificationId,
  rows: notificationRows,
};

/** Registering one (with `body`): the new one is A's, B cannot read it, B's rows are unchanged. */
function registersForA(o: Owned, body: Body): Check {
  return async (ctx, method, path) => {
    const { a, b } = ctx;
    const bBefore = await o.rows(b);
    const made = expectStatus(await a.t.api(method, path, body(ctx)), 201, "register");
    expect((await a.t.api("GET", `${o.path}/${made.json.id}`)).status).toBe(200);
    expectProblem(await b.t.api("GET", `${o.path}/${made.json.id}`), 404, "not_found");
    expect(await o.rows(b)).toEqual(bBefore);
  };
}

/** The list shows A's one only, and nothing of B's. */
function listsA(o: Owned): Check {
  return async ({ a, b }, method, path) => {
    const res = expectStatus(await a.t.api(method, path), 200, "list");
    expect(res.json[o.key].map((x: { id: string }) => x.id)).toEqual([o.idOf(a)]);
    expect(res.text).not.toContain(o.idOf(b));
    expect(res.text).not.toContain(b.tag);
  };
}

/** A's key on B's one → 404 not_found naming nothing of B's; on A's own → 200, the answer. */
async function readsA(o: Owned, { a, b }: Ctx, method: string, path: string) {
  const res = expectProblem(await a.t.api(method, path.replace("{id}", o.idOf(b))), 404, "not_found");
  expect(res.text).not.toContain(b.tag);
  return expectStatus(await a.t.api(method, path.replace("{id}", o.idOf(a))), 200, "read");
}

/** A's key on B's one → 404 not_found and B's rows unchanged; the answer. */
async function refusedOnB(o: Owned, { a, b }: Ctx, method: string, path: string) {
  const bBefore = await o.rows(b);
  const res = expectProblem(await a.t.api(method, path.replace("{id}", o.idOf(b))), 404, "not_found");
  expect(await o.rows(b)).toEqual(bBefore);
  return res;
}

/** The bodies that register a webhook, a notification URL (the suite's own receiver) of A's. */
const newHook: Body = () => ({ name: "new hook", run: { commands: ["true"] } });
const newNotification: Body = ({ a }) => ({ url: `${inject("notificationReceiver")}/hook/new${a.tag}` });

export const ACCOUNT_CASES: Record<string, Case> = {
  "GET /v1/openapi.json": {
    kind: "unscoped",
    inDocument: false,
    reason: "the API's public description: the same for everyone, served without a key, not listed in itself",
  },
  "GET /v1/me": {
    kind: "unscoped",
    inDocument: true,
    reason: "describes the caller's own key (user, environment, key id); takes no id, reads no vault",
  },

  "POST /v1/api-keys": {
    kind: "apiKey",
    id: false,
    body: ({ a }) => ({ name: `key-${a.tag}` }),
    check: async ({ a, b }, method, path) => {
      // The new key is A's: it speaks for A's environment; B's keys are unchanged.
      const bBefore = await keyRows(b);
      const made = expectStatus(await a.t.api(method, path, { name: `key-${a.tag}` }), 201, "create");
      const me = expectStatus(await call(made.json.key, "GET", "/v1/me"), 200, "new key").json;
      expect(me).toMatchObject({ userId: a.t.userId, environmentId: a.t.environmentId, keyId: made.json.id });
      expect((await keyRows(b)).map((k) => k.id)).not.toContain(made.json.id);
      expect(await keyRows(b)).toEqual(bBefore);
    },
  },
  "GET /v1/api-keys": {
    kind: "apiKey",
    id: false,
    check: async ({ a, b }, method, path) => {
      const res = expectStatus(await a.t.api(method, path), 200, "list");
      expect(res.json.apiKeys.map((k: { id: string }) => k.id)).toEqual([a.t.keyId]);
      expect(res.text).not.toContain(b.t.keyId);
      expect(res.text).not.toContain(b.t.key.slice(0, 10));
    },
  },
  "DELETE /v1/api-keys/{id}": {
    kind: "apiKey",
    id: true,
    check: async (ctx, method, path) => {
      const { a, b } = ctx;
      // B's key id → 404 as for no key; B's key still works. A's own (a fresh one) → 204.
      await refusedOnB(KEYS, ctx, method, path);
      expectStatus(await b.t.api("GET", "/v1/me"), 200, "B's key still works");
      const own = expectStatus(await a.t.api("POST", "/v1/api-keys", { name: "spare" }), 201, "spare").json;
      expectStatus(await a.t.api(method, path.replace("{id}", own.id)), 204, "A's own");
      expectProblem(await call(own.key, "GET", "/v1/me"), 401, "unauthorized");
    },
  },

  "POST /v1/webhooks": {
    kind: "webhook",
    id: false,
    body: newHook,
    check: registersForA(WEBHOOKS, newHook),
  },
  "GET /v1/webhooks": { kind: "webhook", id: false, check: listsA(WEBHOOKS) },
  "GET /v1/webhooks/{id}": {
    kind: "webhook",
    id: true,
    check: async (ctx, method, path) => {
      const own = await readsA(WEBHOOKS, ctx, method, path);
      expect(own.json).toMatchObject({ id: ctx.a.webhookId, name: `hook-${ctx.a.tag}` });
    },
  },
  "DELETE /v1/webhooks/{id}": {
    kind: "webhook",
    id: true,
    check: async (ctx, method, path) => {
      const { a, b } = ctx;
      await refusedOnB(WEBHOOKS, ctx, method, path);
      expectStatus(await b.t.api("GET", `/v1/webhooks/${b.webhookId}`), 200, "B still has it");
      expectStatus(await a.t.api(method, path.replace("{id}", a.webhookId)), 204, "A's own");
    },
  },
  "POST /v1/webhooks/{id}/rotate-secret": {
    kind: "webhook",
    id: true,
    check: async (ctx, method, path) => {
      const { a } = ctx;
      const res = await refusedOnB(WEBHOOKS, ctx, method, path);
      expect(res.text).not.toContain("whsec_");
      const own = expectStatus(await a.t.api(method, path.replace("{id}", a.webhookId)), 200, "A's own");
      expect(own.json.id).toBe(a.webhookId);
    },
  },

  "POST /v1/notifications": {
    kind: "notification",
    id: false,
    body: newNotification,
    check: registersForA(NOTIFICATIONS, newNotification),
  },
  "GET /v1/notifications": { kind: "notification", id: false, check: listsA(NOTIFICATIONS) },
  "GET /v1/notifications/{id}": {
    kind: "notification",
    id: true,
    check: async (ctx, method, path) => {
      const own = await readsA(NOTIFICATIONS, ctx, method, path);
      expect(own.json.url).toContain(ctx.a.tag);
    },
  },
  "DELETE /v1/notifications/{id}": {
    kind: "notification",
    id: true,
    check: async (ctx, method, path) => {
      await refusedOnB(NOTIFICATIONS, ctx, method, path);
      expect((await ctx.a.t.api(method, path.replace("{id}", ctx.a.notificationId))).status).toBe(204);
    },
  },
  "GET /v1/notifications/{id}/deliveries": {
    kind: "notification",
    id: true,
    check: async ({ a, b }, method, path) => {
      expectProblem(await a.t.api(method, path.replace("{id}", b.notificationId)), 404, "not_found");
      const own = expectStatus(
        await a.t.api(method, path.replace("{id}", a.notificationId)),
        200,
        "deliveries",
      );
      expect(own.json).toEqual({ deliveries: [], nextCursor: null });
    },
  },
};
