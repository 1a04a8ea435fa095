// What the OCI registry contract server (registry-server.ts, Node) tells the workerd tests, and
// what it recorded. Types only, so both the Node global setup and the workerd tests import it.

export interface RegistryContractInfo {
  /** http://127.0.0.1:<port>: the registry's origin. */
  url: string;
  /** The private ES256 JWK the registry trusts (its public half), as REGISTRY_SIGNING_KEY. */
  signingKey: string;
  /** The token audience (REGISTRY_SERVICE) and issuer (REGISTRY_ISSUER) the registry accepts. */
  service: string;
  issuer: string;
}

/** One request as the contract registry saw it (no header or token is kept, only the outcome). */
export interface RecordedRequest {
  method: string;
  path: string;
  /** The repository the request was about, if any. */
  repository: string | null;
  /** The actions the request needed on that repository. */
  needed: string[];
  auth: "none" | "invalid_token" | "insufficient_scope" | "ok";
  /** The token's `sub` and `jti` when it verified. */
  subject: string | null;
  jti: string | null;
  status: number;
}

declare module "vitest" {
  export interface ProvidedContext {
    registry: RegistryContractInfo;
  }
}
