import { BUNDLE_DEFAULTS, type UploadLimits } from "@benchwright/shared/contract/bundle";
import { type KeyRing, parseKeyRing } from "@benchwright/shared/contract/key-ring";
import { parseDenyList, type TargetPolicy } from "@benchwright/shared/contract/notification-targets";
import { DEFAULT_RESOURCE_BOUNDS, type ResourceBounds } from "@benchwright/shared/contract/run-spec";
import { z } from "zod";

// The Worker's vars and secrets, checked on the first request of an isolate: a missing or
// malformed secret answers every request with config_invalid naming the variable (never its
// value) instead of failing later, half-way through some vault write. Outside development
// (DEPLOYMENT, wrangler.toml's environments) the settings only a development machine may use are
// refused too; src/settings-check.ts adds the default backend's.

export const Deployment = z.enum(["development", "staging", "production"]);
export type Deployment = z.infer<typeof Deployment>;

const EnvSchema = z.object({
  DEPLOYMENT: z
    .enum(["", ...Deployment.options], { error: "DEPLOYMENT must be development, staging or production" })
    .optional(),
  PUBLIC_URL: z.string().optional(),
  COMPUTE_BACKEND: z.string().optional(),
  DATABASE_URL: z
    .string({ error: "DATABASE_URL is not set" })
    .regex(/^postgres(ql)?:\/\//, "DATABASE_URL must be a postgres:// connection string"),
  VAULT_KEK: z.string({ error: "VAULT_KEK is not set" }).min(1, "VAULT_KEK is empty"),
  DATABASE_WS_PROXY: z
    .string()
    .regex(/^$|^[A-Za-z0-9.-]+:\d+$/, "DATABASE_WS_PROXY must be host:port or empty")
    .optional(),
  LINGER_IDLE_SECONDS: z
    .string()
    .regex(/^$|^[1-9]\d{0,5}$/, "LINGER_IDLE_SECONDS must be a whole number of seconds (1-999999)")
    .optional(),
  VAULT_READ_TIMEOUT_SECONDS: z
    .string()
    .regex(/^$|^[1-9]\d{0,2}$/, "VAULT_READ_TIMEOUT_SECONDS must be a whole number of seconds (1-999)")
    .optional(),
  BUNDLE_MAX_BYTES: z
    .string()
    .regex(/^$|^[1-9]\d{0,11}$/, "BUNDLE_MAX_BYTES must be a whole number of bytes")
    .optional(),
  BUNDLE_MAX_UNPACKED_BYTES: z
    .string()
    .regex(/^$|^[1-9]\d{0,12}$/, "BUNDLE_MAX_UNPACKED_BYTES must be a whole number of bytes")
    .optional(),
  BUNDLE_MAX_FILES: z
    .string()
    .regex(/^$|^[1-9]\d{0,7}$/, "BUNDLE_MAX_FILES must be a whole number")
    .optional(),
  RESOURCES_MAX_MEMORY_MB: z
    .string()
    .regex(/^$|^[1-9]\d{0,6}$/, "RESOURCES_MAX_MEMORY_MB must be a whole number of MiB")
    .optional(),
  RESOURCES_MAX_PIDS: z
    .string()
    .regex(/^$|^[1-9]\d{0,6}$/, "RESOURCES_MAX_PIDS must be a whole number")
    .optional(),
  RUNS_MAX_ACTIVE_PER_ENVIRONMENT: z
    .string()
    .regex(/^$|^[1-9]\d{0,4}$/, "RUNS_MAX_ACTIVE_PER_ENVIRONMENT must be a whole number (1-99999)")
    .optional(),
  RESOURCES_MAX_CPUS: z
    .string()
    .regex(/^$|^\d{1,3}(\.\d{1,2})?$/, "RESOURCES_MAX_CPUS must be a number of CPUs (e.g. 4 or 0.5)")
    .optional(),
  NOTIFICATIONS_DENY_HOSTS: z.string().max(10_000, "NOTIFICATIONS_DENY_HOSTS is too long").optional(),
  SETUP_IMAGE_MAX_LAYER_MB: z
    .string()
    .regex(/^$|^[1-9]\d{0,6}$/, "SETUP_IMAGE_MAX_LAYER_MB must be a whole number of MiB")
    .optional(),
  SETUP_IMAGE_MAX_ENVIRONMENT_MB: z
    .string()
    .regex(/^$|^[1-9]\d{0,7}$/, "SETUP_IMAGE_MAX_ENVIRONMENT_MB must be a whole number of MiB")
    .optional(),
  SETUP_IMAGE_UNUSED_DAYS: z
    .string()
    .regex(/^$|^[1-9]\d{0,3}$/, "SETUP_IMAGE_UNUSED_DAYS must be a whole number of days (1-9999)")
    .optional(),
  SETUP_IMAGE_WAIT_SECONDS: z
    .string()
    .regex(/^$|^[1-9]\d{0,4}$/, "SETUP_IMAGE_WAIT_SECONDS must be a whole number of seconds (1-99999)")
    .optional(),
  NOTIFICATIONS_ADMIT_LOOPBACK: z
    .enum(["", "true", "false"], { error: "NOTIFICATIONS_ADMIT_LOOPBACK must be true or false" })
    .optional(),
});

export interface Config {
  /** Which deployment this Worker is (DEPLOYMENT; development when unset). */
  readonly deployment: Deployment;
  readonly databaseUrl: string;
  /** Local bridge host:port; undefined means real Neon over wss. */
  readonly databaseWsProxy: string | undefined;
  readonly keyRing: KeyRing;
  /** Pause a lingering proxy nobody looked at for this long. */
  readonly lingerIdleMs: number;
  /** A run's vault read at start that takes longer is cancelled by the database and retried. */
  readonly vaultReadTimeoutMs: number;
  /** POST /v1/bundles: the largest .tar.gz accepted, and the bounds on what it unpacks to. */
  readonly bundleLimits: UploadLimits;
  readonly resourceBounds: ResourceBounds;
  /** A launch is refused (too_many_runs) while the environment has this many runs not ended. */
  readonly maxActiveRuns: number;
  /** Where run-end notifications may go (src/notifications/target.ts). */
  readonly notificationTargets: TargetPolicy;
  readonly setupImages: SetupImageSettings;
}

/** Setup images (shared/contract/setup-image.ts): their bounds, how long they wait and are kept. */
export interface SetupImageSettings {
  /** A layer larger than this is not kept (the run goes on, its setup uncached). */
  readonly maxLayerBytes: number;
  /** An environment's built layers together; a new one past it is not kept. */
  readonly maxEnvironmentBytes: number;
  /** The reaper drops a setup image nobody started from for this long. */
  readonly unusedMs: number;
  /** A sandbox waits this long for another run's build of its key, then builds its own. */
  readonly waitMs: number;
}

export const DEFAULT_SETUP_IMAGE_SETTINGS = {
  maxLayerMb: 2048,
  maxEnvironmentMb: 10_240,
  unusedDays: 14,
  waitSeconds: 600,
} as const;

/** Runs at once per environment when RUNS_MAX_ACTIVE_PER_ENVIRONMENT is unset (case K4). */
export const DEFAULT_MAX_ACTIVE_RUNS = 10;

export class ConfigError extends Error {}

const cache = new WeakMap<object, Config>();

export function loadConfig(env: Env): Config {
  const hit = cache.get(env);
  if (hit) return hit;
  const parsed = EnvSchema.safeParse(env);
  if (!parsed.success) {
    throw new ConfigError(parsed.error.issues.map((i) => i.message).join("; "));
  }
  const deployment = parsed.data.DEPLOYMENT || "development";
  const unsafe = deployment === "development" ? [] : developmentOnlySettings(parsed.data);
  if (unsafe.length > 0) throw new ConfigError(unsafe.join("; "));
  let keyRing: KeyRing;
  try {
    keyRing = parseKeyRing(parsed.data.VAULT_KEK);
  } catch (e) {
    throw new ConfigError(`VAULT_KEK: ${(e as Error).message}`);
  }
  let deny: string[];
  try {
    deny = parseDenyList(parsed.data.NOTIFICATIONS_DENY_HOSTS);
  } catch (e) {
    throw new ConfigError((e as Error).message);
  }
  const config: Config = {
    deployment,
    databaseUrl: parsed.data.DATABASE_URL,
    databaseWsProxy: parsed.data.DATABASE_WS_PROXY || undefined,
    keyRing,
    lingerIdleMs: Number(parsed.data.LINGER_IDLE_SECONDS || 600) * 1000,
    vaultReadTimeoutMs: Number(parsed.data.VAULT_READ_TIMEOUT_SECONDS || 10) * 1000,
    bundleLimits: {
      maxUploadBytes: Number(parsed.data.BUNDLE_MAX_BYTES || BUNDLE_DEFAULTS.maxUploadBytes),
      maxUnpackedBytes: Number(parsed.data.BUNDLE_MAX_UNPACKED_BYTES || BUNDLE_DEFAULTS.maxUnpackedBytes),
      maxFiles: Number(parsed.data.BUNDLE_MAX_FILES || BUNDLE_DEFAULTS.maxFiles),
    },
    resourceBounds: {
      memoryMb: Number(parsed.data.RESOURCES_MAX_MEMORY_MB || DEFAULT_RESOURCE_BOUNDS.memoryMb),
      pids: Number(parsed.data.RESOURCES_MAX_PIDS || DEFAULT_RESOURCE_BOUNDS.pids),
      cpus: Number(parsed.data.RESOURCES_MAX_CPUS || DEFAULT_RESOURCE_BOUNDS.cpus),
    },
    maxActiveRuns: Number(parsed.data.RUNS_MAX_ACTIVE_PER_ENVIRONMENT || DEFAULT_MAX_ACTIVE_RUNS),
    notificationTargets: { deny, admitLoopback: parsed.data.NOTIFICATIONS_ADMIT_LOOPBACK === "true" },
    setupImages: setupImageSettings(parsed.data),
  };
  cache.set(env, config);
  return config;
}

/**
 * What a staging or production Worker must not have: settings that only work, or are only safe,
 * next to a development machine's loopback. Each message names the variable, never its value.
 */
function developmentOnlySettings(vars: z.infer<typeof EnvSchema>): string[] {
  const problems: string[] = [];
  // A deployed Worker cannot reach a host agent on loopback; unset means local too.
  if (!vars.COMPUTE_BACKEND || vars.COMPUTE_BACKEND === "local") {
    problems.push("COMPUTE_BACKEND must be sandbox0 or e2b outside development");
  }
  if (!vars.PUBLIC_URL) problems.push("PUBLIC_URL is not set");
  else if (!URL.canParse(vars.PUBLIC_URL) || new URL(vars.PUBLIC_URL).protocol !== "https:") {
    problems.push("PUBLIC_URL must be an https URL outside development");
  }
  if (vars.DATABASE_WS_PROXY) problems.push("DATABASE_WS_PROXY must be empty outside development");
  if (vars.NOTIFICATIONS_ADMIT_LOOPBACK === "true") {
    problems.push("NOTIFICATIONS_ADMIT_LOOPBACK must be false outside development");
  }
  return problems;
}

const MIB = 1024 * 1024;

function setupImageSettings(vars: z.infer<typeof EnvSchema>): SetupImageSettings {
  const d = DEFAULT_SETUP_IMAGE_SETTINGS;
  return {
    maxLayerBytes: Number(vars.SETUP_IMAGE_MAX_LAYER_MB || d.maxLayerMb) * MIB,
    maxEnvironmentBytes: Number(vars.SETUP_IMAGE_MAX_ENVIRONMENT_MB || d.maxEnvironmentMb) * MIB,
    unusedMs: Number(vars.SETUP_IMAGE_UNUSED_DAYS || d.unusedDays) * 86_400_000,
    waitMs: Number(vars.SETUP_IMAGE_WAIT_SECONDS || d.waitSeconds) * 1000,
  };
}
