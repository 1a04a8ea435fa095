// The API rate limit's numbers (src/limits/rate-limit.ts), apart from the Worker's types so that
// a Node-side test can hold them against wrangler.toml's binding.

/** The binding's `period` in wrangler.toml: a refused caller may try again after it. */
export const RATE_LIMIT_PERIOD_SECONDS = 10;
/** The binding's `limit` in wrangler.toml: requests per key per period. */
export const RATE_LIMIT_REQUESTS = 300;

/**
 * The refusal's RateLimit-Policy and RateLimit fields (draft-ietf-httpapi-ratelimit-headers-09):
 * the policy (quota per window, by API key) and that none is left for up to one window. The
 * binding reports neither what remains nor when its window turns, so only refusals carry them.
 */
export const RATE_LIMIT_HEADERS = {
  "ratelimit-policy": `"per-key";q=${RATE_LIMIT_REQUESTS};w=${RATE_LIMIT_PERIOD_SECONDS}`,
  ratelimit: `"per-key";r=0;t=${RATE_LIMIT_PERIOD_SECONDS}`,
} as const;
