import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { afterEach, describe, expect, it, vi } from "vitest";
import { createApp } from "../../src/app";
import { BASE } from "./harness";
import { captureLogs, newCanary } from "./leaks";

// The start-up check of a staging or production Worker (src/config.ts, src/settings-check.ts):
// settings only a development machine may use are refused, and so is a default backend that
// cannot be made, each named in one 503 config_invalid and one log line with `event`, never a
// value. The request never reaches the database or an API key check.

interface Answer {
  status: number;
  text: string;
  // biome-ignore lint/suspicious/noExplicitAny: tests read arbitrary JSON
  json: any;
}

async function ask(overrides: Record<string, string | undefined>): Promise<Answer> {
  const ctx = createExecutionContext();
  const res = await createApp().fetch(
    new Request(`${BASE}/v1/vault/secrets`),
    { ...env, ...overrides } as Env,
    ctx,
  );
  const text = await res.text();
  await waitOnExecutionContext(ctx);
  let json: unknown = null;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: res.status, text, json };
}

/** A staging Worker whose own settings are right; the default backend's are the test's. */
const STAGING = {
  DEPLOYMENT: "staging",
  COMPUTE_BACKEND: "sandbox0",
  PUBLIC_URL: "https://bw-staging.example.com",
  DATABASE_WS_PROXY: "",
  NOTIFICATIONS_ADMIT_LOOPBACK: "false",
};

const SANDBOX0 = {
  SANDBOX0_API_URL: "https://k8s.example.com",
  SANDBOX0_TOKEN: "t".repeat(40),
  SANDBOX0_NAMESPACE: "benchwright",
  SANDBOX0_PROXY_IMAGE: `registry.example.com/bw-proxy@sha256:${"a".repeat(64)}`,
  SANDBOX0_WORK_IMAGE: `registry.example.com/bw-work@sha256:${"b".repeat(64)}`,
};

afterEach(() => vi.restoreAllMocks());

describe("a deployment's start-up check", () => {
  it("production with development's settings → 503 naming each one, logged with its event", async () => {
    const logs = captureLogs();
    // Every development-only setting at once, as the top level of wrangler.toml has them.
    const a = await ask({
      DEPLOYMENT: "production",
      COMPUTE_BACKEND: "local",
      PUBLIC_URL: "",
      DATABASE_WS_PROXY: "127.0.0.1:5433",
      NOTIFICATIONS_ADMIT_LOOPBACK: "true",
    });
    expect(`${a.status} ${a.json?.code}`, a.text).toBe("503 config_invalid");
    for (const name of [
      "COMPUTE_BACKEND",
      "PUBLIC_URL",
      "DATABASE_WS_PROXY",
      "NOTIFICATIONS_ADMIT_LOOPBACK",
    ]) {
      expect(a.json.detail).toContain(name);
    }
    const line = logs.find((l) => l.includes('"event":"config_invalid"'));
    expect(line).toBeDefined();
    expect(line).toContain("COMPUTE_BACKEND");
    expect(line).not.toContain("127.0.0.1:5433");
  });

  it("an http PUBLIC_URL is refused outside development", async () => {
    const a = await ask({ ...STAGING, ...SANDBOX0, PUBLIC_URL: "http://bw-staging.example.com" });
    expect(`${a.status} ${a.json?.code}`, a.text).toBe("503 config_invalid");
    expect(a.json.detail).toBe("PUBLIC_URL must be an https URL outside development");
  });

  it("sandbox0 as the default without its settings → each missing one named, no value echoed", async () => {
    const logs = captureLogs();
    const canary = newCanary("sandbox0-token");
    const a = await ask({
      ...STAGING,
      SANDBOX0_TOKEN: canary,
      SANDBOX0_API_URL: "",
      SANDBOX0_PROXY_IMAGE: "",
      SANDBOX0_WORK_IMAGE: "",
    });
    expect(`${a.status} ${a.json?.code}`, a.text).toBe("503 config_invalid");
    for (const name of ["SANDBOX0_API_URL", "SANDBOX0_PROXY_IMAGE", "SANDBOX0_WORK_IMAGE"]) {
      expect(a.json.detail).toContain(`${name} is not set`);
    }
    expect(a.json.detail).not.toContain("SANDBOX0_TOKEN");
    expect(a.text).not.toContain(canary);
    expect(logs.join("\n")).not.toContain(canary);
  });

  it("e2b as the default without its API key → E2B_API_KEY named", async () => {
    const a = await ask({ ...STAGING, COMPUTE_BACKEND: "e2b", E2B_API_KEY: undefined });
    expect(`${a.status} ${a.json?.code}`, a.text).toBe("503 config_invalid");
    expect(a.json.detail).toContain("E2B_API_KEY is not set");
  });

  it("a DEPLOYMENT that is not one of the three is refused", async () => {
    const a = await ask({ DEPLOYMENT: "prod" });
    expect(`${a.status} ${a.json?.code}`, a.text).toBe("503 config_invalid");
    expect(a.json.detail).toBe("DEPLOYMENT must be development, staging or production");
  });

  it("a complete staging Worker passes the check and goes on to the API key check", async () => {
    const a = await ask({ ...STAGING, ...SANDBOX0 });
    expect(a.json?.code, a.text).toBe("unauthorized");
  });

  it("development (the top level of wrangler.toml) keeps the local backend and the bridge", async () => {
    const a = await ask({ DEPLOYMENT: "development", COMPUTE_BACKEND: "local", COMPUTE_BACKEND_URL: "" });
    expect(a.json?.code, a.text).toBe("unauthorized");
  });
});
