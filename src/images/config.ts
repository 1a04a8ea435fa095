import { z } from "zod";
import { ConfigError } from "../config";
import { PATH_COMPONENT, type RegistrySettings } from "./settings";
import { importSigningKey, type SigningKey, SigningKeyError } from "./token";

// The setup images' registry settings (the registry path: sandbox0, E2B), parsed from the
// Worker's vars and the secret REGISTRY_SIGNING_KEY on first use (not at startup: a deployment
// without a registry is valid, and its other routes must not fail for it). An empty REGISTRY_URL means "no cache here"; a set one
// makes the rest required, and a malformed value is config_invalid naming the variable, never
// its value.

const Prefix = z
  .string()
  .min(1, "REGISTRY_REPOSITORY_PREFIX is empty")
  .max(100, "REGISTRY_REPOSITORY_PREFIX is longer than 100 characters")
  .refine(
    (p) => p.split("/").every((c) => PATH_COMPONENT.test(c)),
    "REGISTRY_REPOSITORY_PREFIX must be lowercase path components (e.g. bw-cache)",
  );

const RegistryVars = z.object({
  REGISTRY_URL: z.string(),
  REGISTRY_REPOSITORY_PREFIX: Prefix,
  REGISTRY_SERVICE: z.string({ error: "REGISTRY_SERVICE is not set" }).min(1, "REGISTRY_SERVICE is empty"),
  REGISTRY_ISSUER: z.string({ error: "REGISTRY_ISSUER is not set" }).min(1, "REGISTRY_ISSUER is empty"),
  REGISTRY_SIGNING_KEY: z.string({ error: "REGISTRY_SIGNING_KEY is not set" }),
});

const LOOPBACK = new Set(["127.0.0.1", "localhost", "[::1]"]);

const cache = new WeakMap<object, Promise<RegistrySettings | null>>();

/** The registry settings, or null when this deployment has no cache (REGISTRY_URL empty). */
export function loadRegistrySettings(env: Env): Promise<RegistrySettings | null> {
  const hit = cache.get(env);
  if (hit) return hit;
  const loading = parse(env);
  cache.set(env, loading);
  // A failure is not cached: a fixed secret takes effect without a new isolate.
  loading.catch(() => cache.delete(env));
  return loading;
}

async function parse(env: Env): Promise<RegistrySettings | null> {
  if (!env.REGISTRY_URL) return null;
  const parsed = RegistryVars.safeParse(env);
  if (!parsed.success) throw new ConfigError(parsed.error.issues.map((i) => i.message).join("; "));
  const vars = parsed.data;
  let url: URL;
  try {
    url = new URL(vars.REGISTRY_URL);
  } catch {
    throw new ConfigError("REGISTRY_URL is not a URL");
  }
  // Every request to it carries a token that can read or write (the broker's own push) the images,
  // so plain http only where it cannot leave the machine: local development and the tests.
  if (url.protocol !== "https:" && !(url.protocol === "http:" && LOOPBACK.has(url.hostname))) {
    throw new ConfigError("REGISTRY_URL must be https:// (http:// only on loopback)");
  }
  if (url.pathname !== "/" || url.search || url.hash || url.username || url.password) {
    throw new ConfigError("REGISTRY_URL must be an origin only (scheme, host, port)");
  }
  let signingKey: SigningKey;
  try {
    signingKey = await importSigningKey(vars.REGISTRY_SIGNING_KEY);
  } catch (e) {
    if (e instanceof SigningKeyError) throw new ConfigError(`REGISTRY_SIGNING_KEY: ${e.message}`);
    throw e;
  }
  return {
    url: url.origin,
    host: url.host,
    prefix: vars.REGISTRY_REPOSITORY_PREFIX,
    service: vars.REGISTRY_SERVICE,
    issuer: vars.REGISTRY_ISSUER,
    signingKey,
  };
}
