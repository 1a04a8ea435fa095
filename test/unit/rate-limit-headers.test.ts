import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { describe, expect, it } from "vitest";
import {
  RATE_LIMIT_HEADERS,
  RATE_LIMIT_PERIOD_SECONDS,
  RATE_LIMIT_REQUESTS,
} from "../../src/limits/rate-limit-policy";

// The RateLimit-Policy a 429 names is the binding's: the binding reports neither, so the numbers
// are written twice (wrangler.toml and src/limits/rate-limit-policy.ts), and this keeps them one.

describe("rate limit headers", () => {
  it("name the quota and window wrangler.toml gives API_RATE_LIMIT, in every environment", () => {
    const toml = readFileSync(resolve(import.meta.dirname, "../../wrangler.toml"), "utf8");
    const bindings = [
      ...toml.matchAll(/name = "API_RATE_LIMIT"\s*\n[^[]*?simple = \{ limit = (\d+), period = (\d+) \}/g),
    ];
    expect(bindings.length).toBeGreaterThan(0);
    for (const [, limit, period] of bindings) {
      expect(Number(limit)).toBe(RATE_LIMIT_REQUESTS);
      expect(Number(period)).toBe(RATE_LIMIT_PERIOD_SECONDS);
    }
    expect(RATE_LIMIT_HEADERS["ratelimit-policy"]).toBe(
      `"per-key";q=${RATE_LIMIT_REQUESTS};w=${RATE_LIMIT_PERIOD_SECONDS}`,
    );
  });
});
