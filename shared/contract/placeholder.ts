import { z } from "zod";

// Placeholders (cases N1, N2): for every secret a run's rules inject, the work and task sandboxes
// get an environment variable whose value is recognisably not a key and differs per run. Code
// that reads its key from the environment (`OpenAI()`, `os.environ["GITHUB_TOKEN"]`) starts and
// sends it; the run's proxy swaps it for the secret on that rule's hosts only, and records it
// sent anywhere else. Pure (zod only): the Worker, the coordinator and the proxy all import it.

/** Every placeholder starts with this; redaction and the canary walk look for it. */
export const PLACEHOLDER_PREFIX = "bw-placeholder-";

/** The run's placeholder nonce: made once per run by the coordinator, given to the proxy. */
export const PlaceholderNonce = z.string().regex(/^[a-z0-9]{20,40}$/, "20-40 of a-z 0-9");

/** A fresh nonce: 20 base-36 characters (about 100 bits; not a secret, only per run). */
export function newPlaceholderNonce(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(20));
  return Array.from(bytes, (b) => "abcdefghijklmnopqrstuvwxyz0123456789"[b % 36]).join("");
}

/**
 * The placeholder of `secret` in the run with `nonce`. A secret name is [A-Za-z0-9_.-], all
 * unreserved in URLs and header-safe, so the placeholder travels unencoded in a header, a query
 * and a body alike, and the proxy can find it as a plain substring.
 */
export const placeholderValue = (secret: string, nonce: string): string =>
  `${PLACEHOLDER_PREFIX}${secret}-${nonce}`;

/** Where beyond headers and the query a rule lets the proxy swap its placeholder. */
export const PlaceholderPlace = z.enum(["body"]);
export type PlaceholderPlace = z.infer<typeof PlaceholderPlace>;

/** A body the proxy swaps placeholders in is read whole up to this size; a larger one is refused. */
export const MAX_PLACEHOLDER_BODY_BYTES = 1024 * 1024;

/** A POSIX-portable environment variable name. */
export const EnvName = z
  .string()
  .min(1)
  .max(64)
  .regex(
    /^[A-Za-z_][A-Za-z0-9_]*$/,
    "an environment variable name is letters, digits and _, not starting with a digit",
  )
  .refine(
    (name) => !isReservedEnv(name),
    "this variable is the platform's (proxy, CA, paths or the run's own)",
  );

/**
 * Variables the platform sets or the sandbox needs as they are: a placeholder under one of these
 * would break the wiring or the model lane, or let a rule point the sandbox's trust elsewhere.
 */
const RESERVED_ENV = new Set(
  [
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "PWD",
    "TMPDIR",
    "LANG",
    "TERM",
    "HOSTNAME",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "NODE_OPTIONS",
    "PIP_CERT",
    "PYTHONPATH",
    "PYTHONHOME",
    "OPENAI_BASE_URL",
    "ANTHROPIC_BASE_URL",
  ].map((n) => n.toUpperCase()),
);

export function isReservedEnv(name: string): boolean {
  const upper = name.toUpperCase();
  return (
    RESERVED_ENV.has(upper) ||
    upper.startsWith("BW_") ||
    upper.startsWith("BENCHWRIGHT_") ||
    upper.startsWith("LD_")
  );
}

/** The variable a rule's placeholder goes in when the rule names none: the secret's name, made portable. */
export function defaultPlaceholderEnv(secret: string): string | null {
  const name = secret.replace(/[^A-Za-z0-9_]/g, "_").slice(0, 64);
  return EnvName.safeParse(name).success ? name : null;
}

/** The model lane's variables, which win over a rule's placeholder of the same name (N1). */
export const MODEL_LANE_ENV = ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "BENCHWRIGHT_MODEL"] as const;

export interface PlaceholderEnv {
  env: string;
  secret: string;
}

/**
 * The placeholder variables a run's sandboxes get, from its compiled rules in order: one per
 * variable (the first rule naming it wins), none under a name the declared model's lane sets.
 * Shared by the coordinator (the environment) and the dry run (what it shows).
 */
export function placeholderEnvs(
  rules: readonly { secret: string; placeholderEnv: string | null }[],
  modelDeclared: boolean,
): PlaceholderEnv[] {
  const out: PlaceholderEnv[] = [];
  const taken = new Set<string>(modelDeclared ? MODEL_LANE_ENV : []);
  for (const rule of rules) {
    if (rule.placeholderEnv === null || taken.has(rule.placeholderEnv)) continue;
    taken.add(rule.placeholderEnv);
    out.push({ env: rule.placeholderEnv, secret: rule.secret });
  }
  return out;
}
