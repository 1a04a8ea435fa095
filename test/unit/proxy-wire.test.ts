import {
  AuditBatch,
  AuditVerificationError,
  auditPath,
  MAX_AUDIT_ENTRIES,
  newAuditKey,
  PolicyEnvelope,
  ProxyReady,
  policyEtag,
  policyPath,
  readBearer,
  readyPath,
  signAuditBatch,
  verifyAuditBatch,
} from "@benchwright/shared/contract/proxy-wire";
import { compilePolicy } from "@benchwright/shared/policy/compile";
import { describe, expect, it } from "vitest";

const bearer = { scheme: "bearer", name: "authorization" } as const;

function policy() {
  return compilePolicy({
    version: 3,
    default: "allow",
    hosts: [{ pattern: "evil.example", action: "block" }],
    rules: [
      { host: "api.example.com", secret: "API_KEY", inject: bearer },
      { host: "*.internal.example", secret: "INTERNAL", inject: { scheme: "raw", name: "x-token" } },
      { host: "other.example.com", secret: "API_KEY", inject: bearer },
    ],
  });
}

function batch(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  const at = "2030-01-02T03:04:05.678Z";
  return {
    schema: 1,
    runId: "run_abc",
    batchId: "b-1",
    source: "proxy",
    createdAt: at,
    blockedHosts: [{ host: "evil.example", count: 2, firstSeen: at, lastSeen: at }],
    egressRoutes: [{ host: "api.example.com", route: "direct", count: 5, firstSeen: at, lastSeen: at }],
    ...overrides,
  };
}

const codeOf = (fn: () => unknown): string | undefined => {
  try {
    fn();
  } catch (error) {
    return error instanceof AuditVerificationError ? error.code : `not an AuditVerificationError: ${error}`;
  }
  return undefined;
};

describe("PolicyEnvelope", () => {
  const secrets = { API_KEY: "sk-live-123", INTERNAL: "tok en with spaces ~" };

  it("accepts a document with exactly the secrets its rules name", () => {
    const parsed = PolicyEnvelope.parse({ policy: policy(), secrets });
    expect(parsed.secrets).toEqual(secrets);
    expect(parsed.policy.version).toBe(3);
  });

  it("refuses a rule whose secret has no value", () => {
    const result = PolicyEnvelope.safeParse({ policy: policy(), secrets: { API_KEY: "x" } });
    expect(result.success).toBe(false);
    expect(result.error?.issues.map((i) => i.message)).toContain("no value for the secret INTERNAL");
  });

  it("refuses a secret no rule uses", () => {
    const result = PolicyEnvelope.safeParse({ policy: policy(), secrets: { ...secrets, SPARE: "x" } });
    expect(result.success).toBe(false);
    expect(result.error?.issues[0]?.path).toEqual(["secrets", "SPARE"]);
  });

  it("does not find a secret named after an Object.prototype member", () => {
    const doc = compilePolicy({
      version: 1,
      default: "allow",
      hosts: [],
      rules: [{ host: "api.example.com", secret: "constructor", inject: bearer }],
    });
    expect(PolicyEnvelope.safeParse({ policy: doc, secrets: {} }).success).toBe(false);
  });

  it.each([
    ["empty", ""],
    ["CR LF", "abc\r\nX-Evil: 1"],
    ["NUL", "abc\u0000"],
    ["non-ASCII", "pässword"],
    ["too long", "x".repeat(16_385)],
  ])("refuses a secret value that is %s, without echoing it", (_name, value) => {
    const result = PolicyEnvelope.safeParse({ policy: policy(), secrets: { ...secrets, API_KEY: value } });
    expect(result.success).toBe(false);
    if (value.length > 0) expect(JSON.stringify(result.error?.issues)).not.toContain(value);
  });

  it("accepts the longest printable value", () => {
    const value = "~".repeat(16_384);
    expect(
      PolicyEnvelope.safeParse({ policy: policy(), secrets: { ...secrets, API_KEY: value } }).success,
    ).toBe(true);
  });

  it("refuses unknown fields and an unknown host action (E4)", () => {
    expect(PolicyEnvelope.safeParse({ policy: policy(), secrets, extra: 1 }).success).toBe(false);
    const doc = { ...policy(), hosts: [{ pattern: "evil.example", action: "log" }] };
    expect(PolicyEnvelope.safeParse({ policy: doc, secrets }).success).toBe(false);
  });
});

describe("AuditBatch", () => {
  it("accepts a well-formed batch", () => {
    expect(AuditBatch.parse(batch()).batchId).toBe("b-1");
  });

  it.each<[string, Record<string, unknown>]>([
    ["a path field", { path: "/v1/secret" }],
    ["a wrong schema", { schema: 2 }],
    ["a batch id with a slash", { batchId: "a/b" }],
    ["a batch id of 65 characters", { batchId: "x".repeat(65) }],
    ["an unknown source", { source: "agent" }],
    ["a createdAt that is not ISO", { createdAt: "yesterday" }],
    [
      "a host with a port",
      {
        blockedHosts: [
          {
            host: "evil.example:443",
            count: 1,
            firstSeen: "2030-01-01T00:00:00Z",
            lastSeen: "2030-01-01T00:00:00Z",
          },
        ],
      },
    ],
    [
      "an uppercase host",
      {
        blockedHosts: [
          {
            host: "Evil.example",
            count: 1,
            firstSeen: "2030-01-01T00:00:00Z",
            lastSeen: "2030-01-01T00:00:00Z",
          },
        ],
      },
    ],
    [
      "a host with a path",
      {
        blockedHosts: [
          {
            host: "evil.example/x",
            count: 1,
            firstSeen: "2030-01-01T00:00:00Z",
            lastSeen: "2030-01-01T00:00:00Z",
          },
        ],
      },
    ],
    [
      "a zero count",
      {
        blockedHosts: [
          {
            host: "evil.example",
            count: 0,
            firstSeen: "2030-01-01T00:00:00Z",
            lastSeen: "2030-01-01T00:00:00Z",
          },
        ],
      },
    ],
    [
      "a fractional count",
      {
        blockedHosts: [
          {
            host: "evil.example",
            count: 1.5,
            firstSeen: "2030-01-01T00:00:00Z",
            lastSeen: "2030-01-01T00:00:00Z",
          },
        ],
      },
    ],
    [
      "firstSeen after lastSeen",
      {
        blockedHosts: [
          {
            host: "evil.example",
            count: 1,
            firstSeen: "2030-01-02T00:00:00Z",
            lastSeen: "2030-01-01T00:00:00Z",
          },
        ],
      },
    ],
    [
      "a query field on a row",
      {
        blockedHosts: [
          {
            host: "evil.example",
            count: 1,
            firstSeen: "2030-01-01T00:00:00Z",
            lastSeen: "2030-01-01T00:00:00Z",
            query: "a=1",
          },
        ],
      },
    ],
    [
      "an unknown route",
      {
        egressRoutes: [
          {
            host: "a.example",
            route: "proxy",
            count: 1,
            firstSeen: "2030-01-01T00:00:00Z",
            lastSeen: "2030-01-01T00:00:00Z",
          },
        ],
      },
    ],
  ])("refuses %s", (_name, overrides) => {
    expect(AuditBatch.safeParse(batch(overrides)).success).toBe(false);
  });

  it("refuses a host listed twice, but allows one host on two routes", () => {
    const row = { count: 1, firstSeen: "2030-01-01T00:00:00Z", lastSeen: "2030-01-01T00:00:00Z" };
    const twice = [
      { host: "a.example", ...row },
      { host: "a.example", ...row },
    ];
    expect(AuditBatch.safeParse(batch({ blockedHosts: twice })).success).toBe(false);
    const routes = [
      { host: "a.example", route: "direct", ...row },
      { host: "a.example", route: "refused", ...row },
    ];
    expect(AuditBatch.safeParse(batch({ egressRoutes: routes })).success).toBe(true);
    expect(AuditBatch.safeParse(batch({ egressRoutes: [routes[0], routes[0]] })).success).toBe(false);
  });

  it("accepts IP literals in canonical form only", () => {
    const row = (host: string) => [
      { host, count: 1, firstSeen: "2030-01-01T00:00:00Z", lastSeen: "2030-01-01T00:00:00Z" },
    ];
    expect(AuditBatch.safeParse(batch({ blockedHosts: row("10.0.0.1") })).success).toBe(true);
    expect(AuditBatch.safeParse(batch({ blockedHosts: row("[2001:db8::1]") })).success).toBe(true);
    expect(AuditBatch.safeParse(batch({ blockedHosts: row("0x0a.0.0.1") })).success).toBe(false);
  });

  it("bounds the arrays", () => {
    const row = { count: 1, firstSeen: "2030-01-01T00:00:00Z", lastSeen: "2030-01-01T00:00:00Z" };
    const rows = Array.from({ length: MAX_AUDIT_ENTRIES + 1 }, (_, i) => ({ host: `h${i}.example`, ...row }));
    expect(AuditBatch.safeParse(batch({ blockedHosts: rows })).success).toBe(false);
    expect(AuditBatch.safeParse(batch({ blockedHosts: rows.slice(1) })).success).toBe(true);
  });
});

describe("ProxyReady", () => {
  const ready = {
    caCertPem: "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIQ\n-----END CERTIFICATE-----\n",
    caFingerprint256: "a".repeat(64),
    policyVersion: 4,
    listeners: { tls: 8443, http: 8080, explicit: 3128 },
  };

  it("accepts a ready body, with or without a policy version", () => {
    expect(ProxyReady.parse(ready)).toEqual(ready);
    expect(ProxyReady.safeParse({ ...ready, policyVersion: null }).success).toBe(true);
  });

  it.each<[string, Record<string, unknown>]>([
    ["an uppercase fingerprint", { caFingerprint256: "A".repeat(64) }],
    ["a short fingerprint", { caFingerprint256: "a".repeat(63) }],
    [
      "a private key instead of a certificate",
      { caCertPem: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n" },
    ],
    ["a port of 0", { listeners: { tls: 0, http: 8080, explicit: 3128 } }],
    ["two listeners on one port", { listeners: { tls: 8080, http: 8080, explicit: 3128 } }],
    ["a missing listener", { listeners: { tls: 8443, http: 8080 } }],
    ["an unknown field", { secrets: {} }],
    ["a negative version", { policyVersion: -1 }],
  ])("refuses %s", (_name, overrides) => {
    expect(ProxyReady.safeParse({ ...ready, ...overrides }).success).toBe(false);
  });
});

describe("paths and headers", () => {
  it("URL-encodes the run id", () => {
    expect(policyPath("run_1")).toBe("/internal/runs/run_1/policy");
    expect(auditPath("a/../b")).toBe("/internal/runs/a%2F..%2Fb/audit");
    expect(readyPath("r?x")).toBe("/internal/runs/r%3Fx/ready");
  });

  it("quotes the version as the ETag and reads bearer tokens strictly", () => {
    expect(policyEtag(12)).toBe('"12"');
    expect(readBearer("Bearer tok_1")).toBe("tok_1");
    expect(readBearer("bearer tok_1")).toBeNull();
    expect(readBearer("Bearer ")).toBeNull();
    expect(readBearer("Bearer a b")).toBeNull();
    expect(readBearer(null)).toBeNull();
  });
});

describe("signAuditBatch / verifyAuditBatch (D1, D2, D5 for the audit channel)", () => {
  const key = newAuditKey();
  const body = JSON.stringify(batch());
  const now = () => new Date();

  it("makes whsec_ keys of 32 random bytes", () => {
    expect(key).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/);
    expect(newAuditKey()).not.toBe(key);
  });

  it("verifies a good signature and returns the batch", () => {
    const headers = signAuditBatch(key, "b-1", now(), body);
    expect(headers["webhook-signature"]).toMatch(/^v1,/);
    expect(verifyAuditBatch(key, headers, body, { runId: "run_abc" })).toEqual({
      ...batch(),
      modelCalls: [],
      limitRefusals: [],
      strayPlaceholders: [],
    });
  });

  it("reads headers case-insensitively, from a record or a Headers object", () => {
    const signed = signAuditBatch(key, "b-1", now(), body);
    const upper = Object.fromEntries(Object.entries(signed).map(([k, v]) => [k.toUpperCase(), v]));
    expect(verifyAuditBatch(key, upper, body).batchId).toBe("b-1");
    expect(verifyAuditBatch(key, new Headers(signed), body).batchId).toBe("b-1");
  });

  it("accepts any one matching signature among several (key rotation)", () => {
    const old = newAuditKey();
    const signed = signAuditBatch(key, "b-1", now(), body);
    const other = signAuditBatch(old, "b-1", now(), body)["webhook-signature"];
    const headers = { ...signed, "webhook-signature": `${other} ${signed["webhook-signature"]}` };
    expect(verifyAuditBatch(key, headers, body).batchId).toBe("b-1");
  });

  it("refuses a signature made with another key", () => {
    const headers = signAuditBatch(newAuditKey(), "b-1", now(), body);
    expect(codeOf(() => verifyAuditBatch(key, headers, body))).toBe("unauthenticated");
  });

  it("refuses a tampered body", () => {
    const headers = signAuditBatch(key, "b-1", now(), body);
    const tampered = body.replace('"count":2', '"count":3');
    expect(tampered).not.toBe(body);
    expect(codeOf(() => verifyAuditBatch(key, headers, tampered))).toBe("unauthenticated");
  });

  // case D1
  it.each(["webhook-id", "webhook-timestamp", "webhook-signature"])("refuses a missing %s", (name) => {
    const headers: Record<string, string> = { ...signAuditBatch(key, "b-1", now(), body) };
    delete headers[name];
    expect(codeOf(() => verifyAuditBatch(key, headers, body))).toBe("unauthenticated");
  });

  // case D1
  it.each([
    ["a partial signature", (s: string) => s.slice(0, 20)],
    ["an unversioned signature", (s: string) => s.slice(3)],
    ["a v2 signature", (s: string) => s.replace("v1,", "v2,")],
    ["an empty signature", () => ""],
  ])("refuses %s", (_name, mangle) => {
    const signed = signAuditBatch(key, "b-1", now(), body);
    const headers = { ...signed, "webhook-signature": mangle(signed["webhook-signature"]) };
    expect(codeOf(() => verifyAuditBatch(key, headers, body))).toBe("unauthenticated");
  });

  // case D1
  it("refuses a non-integer timestamp, even one parseInt would read", () => {
    const signed = signAuditBatch(key, "b-1", now(), body);
    for (const ts of [`${signed["webhook-timestamp"]}abc`, `${signed["webhook-timestamp"]}.5`, "-1", ""]) {
      const headers = { ...signed, "webhook-timestamp": ts };
      expect(codeOf(() => verifyAuditBatch(key, headers, body))).toBe("unauthenticated");
    }
  });

  // case D2
  it.each([
    ["6 minutes old", -6 * 60_000],
    ["6 minutes ahead", 6 * 60_000],
  ])("refuses a timestamp %s, accepts one 4 minutes off", (_name, offset) => {
    const stale = signAuditBatch(key, "b-1", new Date(Date.now() + offset), body);
    expect(codeOf(() => verifyAuditBatch(key, stale, body))).toBe("unauthenticated");
    const near = signAuditBatch(key, "b-1", new Date(Date.now() + Math.sign(offset) * 4 * 60_000), body);
    expect(verifyAuditBatch(key, near, body).batchId).toBe("b-1");
  });

  it("refuses a signature whose id is not the batch's (the id is the dedupe key)", () => {
    const headers = signAuditBatch(key, "b-2", now(), body);
    expect(codeOf(() => verifyAuditBatch(key, headers, body))).toBe("invalid_batch");
  });

  it("refuses a signed body that is not JSON or not a batch", () => {
    const text = "not json";
    expect(codeOf(() => verifyAuditBatch(key, signAuditBatch(key, "b-1", now(), text), text))).toBe(
      "invalid_batch",
    );
    const bad = JSON.stringify(batch({ path: "/x" }));
    expect(codeOf(() => verifyAuditBatch(key, signAuditBatch(key, "b-1", now(), bad), bad))).toBe(
      "invalid_batch",
    );
  });

  // case D5
  it("refuses a batch naming another run than the one addressed (D5)", () => {
    const headers = signAuditBatch(key, "b-1", now(), body);
    expect(codeOf(() => verifyAuditBatch(key, headers, body, { runId: "run_other" }))).toBe("wrong_run");
  });

  it("refuses a malformed key as a configuration error", () => {
    expect(() => signAuditBatch("whsec_short", "b-1", now(), body)).toThrow(TypeError);
    expect(() => signAuditBatch("not-a-key", "b-1", now(), body)).toThrow(TypeError);
    expect(() => signAuditBatch(key, "bad id", now(), body)).toThrow(TypeError);
  });
});
