import type { SigningKey } from "./token";

// The registry settings every registry module works from (config.ts parses them from the
// Worker's vars): types and names only, so the modules that talk to the registry also run and
// typecheck in Node, where the Worker's Env does not exist.

/** A repository path component (distribution's grammar): lowercase alphanumerics and separators. */
export const PATH_COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;

export interface RegistrySettings {
  /** Origin the broker calls, e.g. https://registry.example.com (no path, no trailing slash). */
  readonly url: string;
  /** host[:port] as image references spell the registry, e.g. registry.example.com. */
  readonly host: string;
  readonly prefix: string;
  readonly service: string;
  readonly issuer: string;
  readonly signingKey: SigningKey;
}
