import { expect } from "vitest";
import { expectProblem } from "./harness";
import { type Case, expectStatus, snapshot, version } from "./isolation-fixtures";
import { newCanary } from "./leaks";

// The isolation cases of the vault's routes (secrets, rules and their order, host entries,
// models, settings, the preview and the dry run): one per operation, merged into the table of
// the whole document in isolation-cases.ts; isolation-vault.test.ts runs them.

export const VAULT_CASES: Record<string, Case> = {
  "GET /v1/vault/secrets": { kind: "list", resource: "secret" },
  "POST /v1/vault/secrets": {
    kind: "write",
    ok: 201,
    // A name only B has: names are per vault, so this creates A's own secret.
    body: () => ({ name: "B_ONLY_KEY", value: newCanary("a-new") }),
  },
  "GET /v1/vault/secrets/{id}": { kind: "by-id", resource: "secret", ok: 200 },
  "PUT /v1/vault/secrets/{id}": {
    kind: "by-id",
    resource: "secret",
    ok: 200,
    body: () => ({ value: newCanary("a-replace") }),
  },
  "DELETE /v1/vault/secrets/{id}": { kind: "by-id", resource: "secret", ok: 204 },

  "GET /v1/vault/rules": { kind: "list", resource: "rule" },
  "POST /v1/vault/rules": {
    kind: "write",
    ok: 201,
    body: ({ a }) => ({
      host: `new.${a.tag}.example`,
      secret: "API_KEY",
      inject: { scheme: "bearer" },
      position: 0,
    }),
    // A rule can only name a secret of the caller's vault.
    refused: ({ a }) => [
      {
        body: { host: `new2.${a.tag}.example`, secret: "B_ONLY_KEY", inject: { scheme: "bearer" } },
        status: 400,
        code: "unknown_secret",
      },
    ],
  },
  "PUT /v1/vault/rules/order": {
    kind: "write",
    ok: 200,
    body: ({ a }) => ({ ids: [...a.ids.rule].reverse() }),
    refused: ({ a, b }) => [
      { body: { ids: b.ids.rule }, status: 400, code: "invalid_order" },
      { body: { ids: [...a.ids.rule, ...b.ids.rule] }, status: 400, code: "invalid_order" },
      { body: { ids: [...a.ids.rule.slice(1), b.ids.rule[0]] }, status: 400, code: "invalid_order" },
    ],
  },
  "GET /v1/vault/rules/{id}": { kind: "by-id", resource: "rule", ok: 200 },
  "PATCH /v1/vault/rules/{id}": {
    kind: "by-id",
    resource: "rule",
    ok: 200,
    body: ({ a }) => ({
      host: `patched.${a.tag}.example`,
      inject: { scheme: "raw", name: "x-token" },
      position: 0,
    }),
  },
  "DELETE /v1/vault/rules/{id}": { kind: "by-id", resource: "rule", ok: 204 },

  "GET /v1/vault/hosts": { kind: "list", resource: "host" },
  "POST /v1/vault/hosts": {
    kind: "write",
    ok: 200,
    // A pattern B has an entry for: A gets an entry of its own, B's stays as it was.
    body: () => ({ pattern: "b-only.shared.example", action: "block" }),
  },
  "POST /v1/vault/hosts/starter-pack": { kind: "write", ok: 200, body: () => ({}) },
  "POST /v1/vault/hosts/from-blocked": {
    kind: "write",
    ok: 200,
    // A's run's blocked host, and a host B has an entry for: A gets entries of its own.
    body: ({ a }) => ({ hosts: [`blocked.${a.tag}.example`, "b-only.shared.example"] }),
    refused: ({ a }) => [
      { body: { hosts: [`*.evil-${a.tag}.example`] }, status: 400, code: "invalid_host_pattern" },
      { body: { hosts: [] }, status: 400, code: "invalid_request" },
    ],
  },
  "GET /v1/vault/hosts/{id}": { kind: "by-id", resource: "host", ok: 200 },
  "PATCH /v1/vault/hosts/{id}": {
    kind: "by-id",
    resource: "host",
    ok: 200,
    body: () => ({ action: "block" }),
  },
  "DELETE /v1/vault/hosts/{id}": { kind: "by-id", resource: "host", ok: 204 },

  "GET /v1/vault/models": { kind: "list", resource: "model" },
  "POST /v1/vault/models": {
    kind: "write",
    ok: 201,
    // A name only B has: names are per vault, so this creates A's own model.
    body: ({ a }) => ({
      name: "b-only-model",
      provider: "openai",
      baseUrl: `https://new.${a.tag}.example/v1`,
      secret: "API_KEY",
    }),
    // A model can only name a secret of the caller's vault, and a name A has is A's conflict.
    refused: ({ a }) => [
      {
        body: {
          name: "x",
          provider: "openai-compatible",
          baseUrl: `https://x.${a.tag}.example`,
          secret: "B_ONLY_KEY",
        },
        status: 400,
        code: "unknown_secret",
      },
      {
        body: {
          name: "shared-model",
          provider: "openai-compatible",
          baseUrl: `https://x.${a.tag}.example`,
          secret: "API_KEY",
        },
        status: 409,
        code: "model_exists",
      },
    ],
  },
  "GET /v1/vault/models/{id}": { kind: "by-id", resource: "model", ok: 200 },
  "PATCH /v1/vault/models/{id}": {
    kind: "by-id",
    resource: "model",
    ok: 200,
    body: ({ a }) => ({ provider: "anthropic", baseUrl: `https://patched.${a.tag}.example/v1` }),
  },
  "DELETE /v1/vault/models/{id}": { kind: "by-id", resource: "model", ok: 204 },

  "GET /v1/vault/settings": {
    kind: "read",
    check: async ({ a, b }, res) => {
      // Both vaults made the same writes, so one more in A makes the two readings differ.
      expectStatus(await a.t.api("PUT", "/v1/vault/settings", { default: "allow" }), 200, "A allow");
      const mine = expectStatus(await a.t.api("GET", "/v1/vault/settings"), 200, "A settings");
      const theirs = expectStatus(await b.t.api("GET", "/v1/vault/settings"), 200, "B settings");
      expect(res.json).toEqual({ default: "block", version: theirs.json.version });
      expect(mine.json).toEqual({ default: "allow", version: theirs.json.version + 1 });
      expect(theirs.json.default).toBe("block");
    },
  },
  "PUT /v1/vault/settings": { kind: "write", ok: 200, body: () => ({ default: "allow" }) },
  "POST /v1/vault/dry-run": {
    kind: "run",
    id: false,
    body: ({ a }) => ({ runId: a.runId, changes: { default: "allow" } }),
    check: async ({ a, b }, method, path) => {
      // B's run id → 404 as for no run; B's secret names are unknown in A's vault; nothing written.
      const bBefore = await snapshot(b.t);
      const aVersion = await version(a.t);
      for (const body of [
        { runId: b.runId, changes: {} },
        { runId: b.runId, draft: { default: "block", hosts: [], rules: [] } },
      ]) {
        const res = expectProblem(await a.t.api(method, path, body), 404, "not_found");
        expect(res.text).not.toContain(b.tag);
      }
      const theirs = { host: `x.${a.tag}.example`, secret: "B_ONLY_KEY", inject: { scheme: "bearer" } };
      const body = { runId: a.runId, changes: { rules: { add: [theirs] } } };
      expectProblem(await a.t.api(method, path, body), 400, "unknown_secret");
      const own = expectStatus(
        await a.t.api(method, path, { runId: a.runId, changes: { default: "allow" } }),
        200,
        "A's own run",
      );
      expect((own.json.hosts as { host: string }[]).map((h) => h.host).sort()).toEqual([
        `blocked.${a.tag}.example`,
        `other.${a.tag}.example`,
      ]);
      expect(own.text).not.toContain(b.tag);
      for (const value of [...a.values, ...b.values]) expect(own.text).not.toContain(value);
      expect(await snapshot(b.t)).toEqual(bBefore);
      expect(await version(a.t)).toBe(aVersion);
    },
  },
  "GET /v1/vault/policy-preview": {
    kind: "read",
    check: async ({ a, b }, res) => {
      const hosts = expectStatus(await a.t.api("GET", "/v1/vault/hosts"), 200, "A hosts");
      const patterns = (hosts.json.hosts as { pattern: string }[]).map((h) => h.pattern).sort();
      expect((res.json.hosts as { pattern: string }[]).map((h) => h.pattern).sort()).toEqual(patterns);
      expect((res.json.rules as { host: string }[]).map((r) => r.host)).toEqual([
        `upload.${a.tag}.example`,
        `api.${a.tag}.example`,
      ]);
      expect(res.json.version).toBe(await version(a.t));
      expect(res.text).not.toContain(b.tag);
    },
  },
};
