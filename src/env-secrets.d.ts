// Secrets a deployment sets only for the compute backends it uses, so they are not in wrangler's
// `[secrets] required` (which every deployment must set) and `wrangler types` does not see them.
// Since wrangler 4.1xx the global `Env` no longer extends `Cloudflare.Env` (both extend a
// generated base), so both are widened here.
interface OptionalSecrets {
  /** sandbox0: the broker's Kubernetes service account token. */
  SANDBOX0_TOKEN?: string;
  /** e2b: the broker's E2B API key. */
  E2B_API_KEY?: string;
  /** Image build cache: the private ES256 JWK the registry's token auth trusts (docs/image-cache.md). */
  REGISTRY_SIGNING_KEY?: string;
}
interface Env extends OptionalSecrets {}
declare namespace Cloudflare {
  interface Env extends OptionalSecrets {}
}
