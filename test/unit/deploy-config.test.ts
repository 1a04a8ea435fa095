import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { unstable_readConfig } from "wrangler";

// wrangler.toml's deployments, read by wrangler itself: an environment inherits no var, secret or
// binding, so each must list them all again, with the safe values, and its own stores.

interface Read {
  name: string;
  vars: Record<string, unknown>;
  secrets?: { required?: string[] };
  durable_objects: { bindings: { name: string; class_name: string }[] };
  r2_buckets: { binding: string; bucket_name: string }[];
  ratelimits: { name: string; namespace_id: string; simple: unknown }[];
  migrations: unknown[];
  triggers: unknown;
}

const read = (env?: string) =>
  unstable_readConfig({ config: "wrangler.toml", env }, { hideWarnings: true }) as unknown as Read;

const top = read();
const ENVIRONMENTS = ["staging", "production"] as const;

describe("wrangler.toml", () => {
  it("the top level is development", () => {
    expect(top.vars.DEPLOYMENT).toBe("development");
  });

  describe.each(ENVIRONMENTS)("[env.%s]", (env) => {
    const c = read(env);

    it("lists every var of the top level, no more", () => {
      expect(Object.keys(c.vars).sort()).toEqual(Object.keys(top.vars).sort());
    });

    it("has the safe values: no local backend, no bridge, no loopback notifications", () => {
      expect(c.vars.DEPLOYMENT).toBe(env);
      expect(["sandbox0", "e2b"]).toContain(c.vars.COMPUTE_BACKEND);
      expect(c.vars.COMPUTE_BACKEND_URL).toBe("");
      expect(c.vars.DATABASE_WS_PROXY).toBe("");
      expect(c.vars.NOTIFICATIONS_ADMIT_LOOPBACK).toBe("false");
    });

    it("requires the secrets every deployment needs and its default backend's credential", () => {
      const credential = { sandbox0: "SANDBOX0_TOKEN", e2b: "E2B_API_KEY" }[c.vars.COMPUTE_BACKEND as string];
      expect(c.secrets?.required).toEqual(["DATABASE_URL", "VAULT_KEK", credential]);
    });

    it("binds the same Durable Objects and rate limit, under its own Worker name, bucket and counter", () => {
      expect(c.name).toBe(`benchwright-boundary-${env}`);
      expect(c.durable_objects.bindings).toEqual(top.durable_objects.bindings);
      expect(c.r2_buckets.map((b) => b.binding)).toEqual(top.r2_buckets.map((b) => b.binding));
      expect(c.ratelimits.map((r) => [r.name, r.simple])).toEqual(
        top.ratelimits.map((r) => [r.name, r.simple]),
      );
      expect(c.migrations).toEqual(top.migrations);
      expect(c.triggers).toEqual(top.triggers);
    });
  });

  it("no two deployments share a bucket or a rate-limit counter", () => {
    const all = [top, ...ENVIRONMENTS.map((e) => read(e))];
    const buckets = all.flatMap((c) => c.r2_buckets.map((b) => b.bucket_name));
    const counters = all.flatMap((c) => c.ratelimits.map((r) => r.namespace_id));
    expect(new Set(buckets).size).toBe(buckets.length);
    expect(new Set(counters).size).toBe(counters.length);
  });

  it("the operator guide names every var and every deployment's required secret", () => {
    const guide = readFileSync("docs/operator-guide.md", "utf8");
    const names = [...Object.keys(top.vars), ...ENVIRONMENTS.flatMap((e) => read(e).secrets?.required ?? [])];
    expect(names.filter((n) => !guide.includes(n))).toEqual([]);
  });
});
