import { expect } from "vitest";
import { newTenant, type Tenant } from "./harness";

// What the vault's route tests set up and read back over the API: a tenant with secrets, rules,
// host entries and the rules' order.

export const RULE_FIELDS = [
  "createdAt",
  "host",
  "id",
  "inject",
  "methods",
  "paths",
  "placeholderEnv",
  "placeholderIn",
  "position",
  "secret",
  "updatedAt",
];

export async function tenantWithSecret(...names: string[]): Promise<Tenant> {
  const t = await newTenant();
  for (const name of names.length > 0 ? names : ["KEY"]) {
    const res = await t.api("POST", "/v1/vault/secrets", { name, value: `value-of-${name}` });
    expect(res.status, res.text).toBe(201);
  }
  return t;
}

export async function addRule(t: Tenant, host: string, secret = "KEY", extra: Record<string, unknown> = {}) {
  const res = await t.api("POST", "/v1/vault/rules", {
    host,
    secret,
    inject: { scheme: "bearer" },
    ...extra,
  });
  expect(res.status, res.text).toBe(201);
  return res.json;
}

export async function hosts(
  t: Tenant,
): Promise<{ id: string; pattern: string; action: string; implicit: boolean }[]> {
  const res = await t.api("GET", "/v1/vault/hosts");
  expect(res.status).toBe(200);
  return res.json.hosts;
}

export const entryFor = async (t: Tenant, pattern: string) =>
  (await hosts(t)).find((h) => h.pattern === pattern);

export async function order(t: Tenant): Promise<string[]> {
  const res = await t.api("GET", "/v1/vault/rules");
  expect(res.status).toBe(200);
  expect(res.json.rules.map((r: { position: number }) => r.position)).toEqual(
    res.json.rules.map((_: unknown, i: number) => i),
  );
  return res.json.rules.map((r: { id: string }) => r.id);
}

export const HOST_FIELDS = [
  "action",
  "createdAt",
  "id",
  "implicit",
  "methods",
  "paths",
  "pattern",
  "updatedAt",
  "via",
];

export async function version(t: Tenant): Promise<number> {
  const res = await t.api("GET", "/v1/vault/settings");
  expect(res.status).toBe(200);
  return res.json.version;
}

export async function put(t: Tenant, pattern: string, action: "allow" | "block") {
  const res = await t.api("POST", "/v1/vault/hosts", { pattern, action });
  expect(res.status, res.text).toBe(200);
  return res.json;
}

export async function secret(t: Tenant, name = "KEY") {
  const res = await t.api("POST", "/v1/vault/secrets", { name, value: `value-of-${name}` });
  expect(res.status, res.text).toBe(201);
  return res.json;
}

export async function rule(t: Tenant, host: string, name = "KEY") {
  const res = await t.api("POST", "/v1/vault/rules", { host, secret: name, inject: { scheme: "bearer" } });
  expect(res.status, res.text).toBe(201);
  return res.json;
}

export async function preview(t: Tenant, query = "") {
  const res = await t.api("GET", `/v1/vault/policy-preview${query}`);
  expect(res.status, res.text).toBe(200);
  return res.json;
}
