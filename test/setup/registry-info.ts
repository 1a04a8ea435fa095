// What the suite's real OCI registry (test/setup/registry.ts: Debian's docker-registry, the CNCF
// distribution registry, with token auth) tells the tests. Types only, so the workerd tests and
// the Node setup both import it.

export interface RealRegistryInfo {
  /** http://127.0.0.1:<port>: the registry's origin, as REGISTRY_URL. */
  url: string;
  /** 127.0.0.1:<port>: the registry as image references spell it. */
  host: string;
  /** The private ES256 JWK (no `kid`) whose public half the registry trusts: REGISTRY_SIGNING_KEY. */
  signingKey: string;
  /** The token audience (REGISTRY_SERVICE) and issuer (REGISTRY_ISSUER) the registry accepts. */
  service: string;
  issuer: string;
  /** The realm the registry's challenges name: a recorder nobody should ever call. */
  realm: string;
  /** GET this for the calls the realm saw, as RealmCall[]. */
  realmCalls: string;
  /** The registry's storage root (for scans of what it stores). */
  storage: string;
}

/** One request to the realm recorder: what was asked, never a credential. */
export interface RealmCall {
  method: string;
  path: string;
  scope: string | null;
}

declare module "vitest" {
  export interface ProvidedContext {
    /** null where docker-registry is not installed (the tests that need it skip, naming it). */
    realRegistry: RealRegistryInfo | null;
    /** Why realRegistry is null. */
    realRegistryMissing: string | null;
  }
}
