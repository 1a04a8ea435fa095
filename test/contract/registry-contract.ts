// What the misbehaving OCI registry contract server (registry-server.ts, Node) tells the workerd
// tests, and what it recorded. Types only, so both the Node global setup and the workerd tests
// import it. The suite's real registry is test/setup/registry.ts.

/** The misbehaviours, each served at /v2/contract/<name>/manifests/<any reference>. */
export type MisbehaviourName =
  | "digest-mismatch"
  | "oversized-declared"
  | "oversized-streamed"
  | "redirect"
  | "basic-challenge"
  | "server-error";

export interface RegistryContractInfo {
  /** http://127.0.0.1:<port>: the registry's origin. */
  url: string;
  /** The service its Bearer challenges name. */
  service: string;
}

/** One request as the contract registry saw it: whether it carried a bearer token, never the token. */
export interface RecordedRequest {
  method: string;
  path: string;
  authorized: boolean;
}

declare module "vitest" {
  export interface ProvidedContext {
    registryContract: RegistryContractInfo;
  }
}
