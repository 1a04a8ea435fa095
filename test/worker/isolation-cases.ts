import { expect, it } from "vitest";
import { call, expectProblem, newTenant } from "./harness";
import { ACCOUNT_CASES } from "./isolation-account-cases";
import { FILE_CASES } from "./isolation-file-cases";
import {
  type Case,
  COLLECTIONS,
  type Ctx,
  expectNoWidening,
  expectStatus,
  fresh,
  ownRunOnly,
  rows,
  snapshot,
  twoVaults,
  type Vault,
  version,
} from "./isolation-fixtures";
import { RUN_CASES } from "./isolation-run-cases";
import { VAULT_CASES } from "./isolation-vault-cases";
import { auditRows } from "./run-fixtures";

// The table of isolation cases, one per operation of the OpenAPI document (merged from one
// table per resource family), the test each kind of case makes, and how to call any operation
// as its owner would. The meta-test in isolation-routes.test.ts fails when the document lists an
// operation CASES has no case for; each family's table is run by its own isolation-<family>
// test file, and the sweeps over every operation (C3, C4, bad keys) use the whole table.

export const CASES: Record<string, Case> = { ...ACCOUNT_CASES, ...VAULT_CASES, ...RUN_CASES, ...FILE_CASES };

/** What the test of a case with a check of its own says A's key reaches, by the case's kind. */
const REACHES: Record<"run" | "webhook" | "notification" | "apiKey" | "bundle" | "setupImage", string> = {
  run: "A's runs only",
  webhook: "A's webhooks only",
  notification: "A's notification URLs only",
  apiKey: "A's API keys only",
  bundle: "A's bundles only (case H3)",
  setupImage: "A's setup images only (case P3)",
};

/** The test of each case of `cases` (one `it` per operation), for the caller's describe block. */
export function caseTests(cases: Record<string, Case>): void {
  for (const [op, c] of Object.entries(cases)) {
    const { method, path } = split(op);

    if (c.kind === "by-id") {
      it(`${op} with B's ids → 404 not_found, B unchanged (A's own id works)`, async () => {
        const ctx = await twoVaults();
        const { a, b } = ctx;
        const bBefore = await snapshot(b.t);
        const aBefore = await rows(a.t);
        const theirs = b.ids[c.resource];
        expect(theirs.length).toBeGreaterThan(0);
        for (const id of theirs) {
          const res = await a.t.api(method, path.replace("{id}", id), c.body?.(ctx));
          expectProblem(res, 404, "not_found");
        }
        expect(await snapshot(b.t)).toEqual(bBefore);
        // The refused change was rolled back in A too: not even A's version moved.
        expect(await rows(a.t)).toEqual(aBefore);
        const own = await fresh(a, c.resource);
        const res = await a.t.api(method, path.replace("{id}", own), c.body?.(ctx));
        expect(res.status, res.text).toBe(c.ok);
      });
    }

    if (c.kind === "by-run") {
      it(`${op} with B's run id → 404 not_found, B's rows unchanged (A's own run lists A's rows only)`, async () => {
        const ctx = await twoVaults();
        const { a, b } = ctx;
        const bBefore = await auditRows(b.runId);
        expect(bBefore.blocked.length).toBeGreaterThan(0);
        const own = await ownRunOnly(ctx, method, path, op);
        expect(await auditRows(b.runId)).toEqual(bBefore);
        const items = own.json[c.key] as { host: string }[];
        expect(items.map((i) => i.host).sort()).toEqual([
          `blocked.${a.tag}.example`,
          `other.${a.tag}.example`,
        ]);
        await expectNoWidening(ctx, method, path);
      });
    }

    if (c.kind === "list") {
      it(`${op} lists only A's items`, async () => {
        const { a, b } = await twoVaults();
        const res = expectStatus(await a.t.api(method, path), 200, op);
        const listed = (res.json[COLLECTIONS[c.resource].key] as { id: string }[]).map((i) => i.id);
        expect([...listed].sort()).toEqual([...a.ids[c.resource]].sort());
        expect(b.ids[c.resource].length).toBeGreaterThan(0);
        for (const id of b.ids[c.resource]) expect(res.text).not.toContain(id);
        expect(res.text).not.toContain(b.tag);
        expect(res.text).not.toContain(b.t.environmentId);
        expect(res.text).not.toContain(b.t.userId);
      });
    }

    if (c.kind === "read") {
      it(`${op} shows A's vault only`, async () => {
        const ctx = await twoVaults();
        const bBefore = await snapshot(ctx.b.t);
        const res = expectStatus(await ctx.a.t.api(method, path), 200, op);
        await c.check(ctx, res);
        expect(await snapshot(ctx.b.t)).toEqual(bBefore);
      });
    }

    if (c.kind === "write") {
      it(`${op} changes only A's vault (B's version and data unchanged)`, async () => {
        const ctx = await twoVaults();
        const { a, b } = ctx;
        const bBefore = await snapshot(b.t);
        const aVersion = await version(a.t);
        for (const refused of c.refused?.(ctx) ?? []) {
          expectProblem(await a.t.api(method, path, refused.body), refused.status, refused.code);
        }
        expect(await version(a.t)).toBe(aVersion);
        const res = await a.t.api(method, path, c.body(ctx));
        expect(res.status, res.text).toBe(c.ok);
        if (typeof res.json?.id === "string") {
          for (const ids of Object.values(b.ids)) expect(ids).not.toContain(res.json.id);
        }
        expect(await version(a.t)).toBeGreaterThan(aVersion);
        expect(await snapshot(b.t)).toEqual(bBefore);
      });
    }

    if (
      c.kind === "run" ||
      c.kind === "webhook" ||
      c.kind === "notification" ||
      c.kind === "apiKey" ||
      c.kind === "bundle" ||
      c.kind === "setupImage"
    ) {
      it(`${op}: A's key reaches ${REACHES[c.kind]}`, async () => {
        const ctx = await twoVaults();
        await c.check(ctx, method, path);
      });
    }

    if (c.kind === "unscoped") {
      it(`${op} is not tenant-scoped (${c.reason}); it tells A nothing about B`, async () => {
        const [a, b] = [await newTenant(), await newTenant()];
        const mine = expectStatus(await a.api(method, path), 200, `${op} as A`);
        const theirs = expectStatus(await b.api(method, path), 200, `${op} as B`);
        expect(mine.text).not.toContain(b.userId);
        expect(mine.text).not.toContain(b.environmentId);
        if (op === "GET /v1/me") {
          expect(mine.json).toMatchObject({ userId: a.userId, environmentId: a.environmentId });
        } else {
          // The same document for A, B and a caller without a key.
          expect(theirs.text).toBe(mine.text);
          expect((await call(null, method, path)).text).toBe(mine.text);
        }
      });
    }
  }
}

const METHODS = ["get", "put", "post", "delete", "patch", "head", "options", "trace"];

/** "METHOD /path" for every operation the live OpenAPI document lists. */
export async function documentOperations(): Promise<string[]> {
  const doc = expectStatus(await call(null, "GET", "/v1/openapi.json"), 200, "openapi.json").json;
  const ops: string[] = [];
  for (const [path, item] of Object.entries(doc.paths as Record<string, object>)) {
    for (const method of Object.keys(item)) {
      if (METHODS.includes(method)) ops.push(`${method.toUpperCase()} ${path}`);
    }
  }
  return ops;
}

/** "METHOD /path" of every operation whose request body may be JSON. */
export async function jsonBodyOperations(): Promise<Set<string>> {
  const doc = expectStatus(await call(null, "GET", "/v1/openapi.json"), 200, "openapi.json").json;
  const ops = new Set<string>();
  for (const [path, item] of Object.entries(doc.paths as Record<string, Record<string, unknown>>)) {
    for (const [method, op] of Object.entries(item)) {
      const content = (op as { requestBody?: { content?: Record<string, unknown> } }).requestBody?.content;
      if (!content || "application/json" in content) ops.add(`${method.toUpperCase()} ${path}`);
    }
  }
  return ops;
}

export const split = (op: string) => {
  const [method, path] = op.split(" ") as [string, string];
  return { method, path };
};

/** The path of `op` on things of `v`'s: a real id of `v` (by-id: the first) in every placeholder. */
export function pathFor(op: string, v: Vault): string {
  const { path } = split(op);
  const c = CASES[op];
  const id =
    c?.kind === "by-id"
      ? (v.ids[c.resource][0] ?? "missing")
      : c?.kind === "by-run" || (c?.kind === "run" && c.id)
        ? v.runId
        : c?.kind === "webhook" && c.id
          ? v.webhookId
          : c?.kind === "notification" && c.id
            ? v.notificationId
            : c?.kind === "apiKey" && c.id
              ? v.t.keyId
              : "no_case_for_this_route";
  return path
    .replace("{id}", id)
    .replace("{sha256}", v.bundle)
    .replace("{artifactId}", v.artifactId)
    .replace("{key}", v.setupImage);
}

/** A call of `op` that would succeed for its owner: a real id of `v` and a valid body. */
export function sample(op: string, ctx: Ctx, v: Vault): { method: string; path: string; body: unknown } {
  const c = CASES[op];
  const body = c && "body" in c ? c.body?.(ctx) : undefined;
  return { method: split(op).method, path: pathFor(op, v), body };
}
