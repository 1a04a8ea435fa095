import { Webhook, WebhookVerificationError } from "standardwebhooks";
import { z } from "zod";
import { canonicalHost } from "./host-name";
import { LIMIT_KINDS } from "./http-limits";
import { MODEL_ENDPOINTS } from "./model-lane";
import { PolicyDocumentShape } from "./policy";
import { followsFromEntries } from "./policy-routing";

// The wire contract between a run's proxy and the control plane (the Worker). Imported by both
// sides, so they cannot drift; pure (zod + standardwebhooks, no node: imports) because workerd
// loads it too.
//
//   GET  /internal/runs/{runId}/policy  → PolicyEnvelope, ETag "<version>", 304 on If-None-Match
//   POST /internal/runs/{runId}/audit   ← AuditBatch, signed (Standard Webhooks) with the run's
//                                         audit key; 2xx stored, 409 already stored (the proxy
//                                         treats both as delivered), any other 4xx is final
//   POST /internal/runs/{runId}/ready   ← ProxyReady
//
// Every call carries `Authorization: Bearer <proxy token>`. Audit batches are signed as well,
// so that a leaked token alone cannot forge audit rows, and so that a batch is bound to its id
// (the control plane de-duplicates on it: a retried or replayed batch is stored once, case D5).

// ---- identifiers and paths ----

const ID = /^[A-Za-z0-9_-]{1,64}$/;

/** An opaque run id as the control plane makes it (`run_...`). */
export const RunId = z.string().regex(ID, "a run id is 1-64 of A-Z a-z 0-9 _ -");
export type RunId = z.infer<typeof RunId>;

/** A batch id: the idempotency key of an audit batch, and its Standard Webhooks message id. */
export const BatchId = z.string().regex(ID, "a batch id is 1-64 of A-Z a-z 0-9 _ -");
export type BatchId = z.infer<typeof BatchId>;

const runPath = (runId: string, leaf: string) => `/internal/runs/${encodeURIComponent(runId)}/${leaf}`;
export const policyPath = (runId: string): string => runPath(runId, "policy");
export const auditPath = (runId: string): string => runPath(runId, "audit");
export const readyPath = (runId: string): string => runPath(runId, "ready");

export const AUTHORIZATION_HEADER = "authorization";
export const CONTENT_TYPE_HEADER = "content-type";
export const JSON_CONTENT_TYPE = "application/json";
export const ETAG_HEADER = "etag";
export const IF_NONE_MATCH_HEADER = "if-none-match";
export const AUDIT_ID_HEADER = "webhook-id";
export const AUDIT_TIMESTAMP_HEADER = "webhook-timestamp";
export const AUDIT_SIGNATURE_HEADER = "webhook-signature";

/** The `Authorization` value for a proxy token. */
export const bearer = (proxyToken: string): string => `Bearer ${proxyToken}`;

/** The token of a `Bearer` Authorization value, or null. */
export function readBearer(value: string | null | undefined): string | null {
  const match = /^Bearer ([\x21-\x7e]{1,512})$/.exec(value ?? "");
  return match?.[1] ?? null;
}

/**
 * The platform's own probe host: the wiring step in a work sandbox asks for it through the
 * redirect it just installed, and the proxy answers it itself (403 with PROBE_HEADER: refused),
 * whatever the policy says and without an audit row. `.invalid` never resolves (RFC 6761), and the
 * wiring step also checks that the TLS chain ends at the run CA, so only the run's proxy can give
 * that answer.
 */
export const WIRING_PROBE_HOST = "probe.benchwright.invalid";
/** Response header the proxy sets on its answer to WIRING_PROBE_HOST. */
export const PROBE_HEADER = "x-benchwright-probe";

/**
 * The model lane's host inside a run: the proxy answers it itself (http or https) and makes the
 * real call to the run's declared model. Like the probe host it never resolves outside a run;
 * the wiring maps it to the proxy in every hosts file.
 */
export const MODEL_LANE_HOST = "model.benchwright.invalid";
/** What a work sandbox gets as its OpenAI base URL when the run declares a model. */
export const MODEL_LANE_BASE_URL = `http://${MODEL_LANE_HOST}/v1`;
/**
 * ...and as its Anthropic base URL: the host alone, since Anthropic's SDKs add /v1/messages to
 * ANTHROPIC_BASE_URL themselves (their default is https://api.anthropic.com, no /v1).
 */
export const MODEL_LANE_ANTHROPIC_BASE_URL = `http://${MODEL_LANE_HOST}`;
/**
 * The platform's own names every hosts file maps to the run's proxy, whatever the routing: the
 * wiring probe and the model lane (catch-all routing would bring them anyway; default routing
 * needs the entries).
 */
export const PLATFORM_HOSTS: readonly string[] = [WIRING_PROBE_HOST, MODEL_LANE_HOST];

/** The placeholder API key a work sandbox gets: never a credential, only there so SDKs start. */
export const MODEL_LANE_PLACEHOLDER_KEY = "bw-model-lane-placeholder";

/** The ETag of a policy document: its version, quoted. */
export const policyEtag = (version: number): string => `"${version}"`;

// ---- policy ----

/** Same grammar as the vault's secret names. */
export const SecretName = z
  .string()
  .regex(/^[A-Za-z_][A-Za-z0-9_.-]{0,63}$/, "letters, digits, _ . - (max 64), starting with a letter or _");

// Printable ASCII only: the value goes into a header or a query string, so CR, LF, NUL and
// non-ASCII could split or corrupt the request. Messages never echo the value.
export const SecretValue = z
  .string()
  .min(1, "the value is empty")
  .max(16_384, "at most 16 KiB")
  .regex(/^[\x20-\x7e]+$/, "printable ASCII only");

/** Body of `GET policyPath(runId)`: the document plus the values of exactly the secrets it names. */
const PolicyEnvelopeShape = z
  .strictObject({ policy: PolicyDocumentShape, secrets: z.record(SecretName, SecretValue) })
  .superRefine((envelope, ctx) => {
    const named = new Set(envelope.policy.rules.map((r) => r.secret));
    if (envelope.policy.model) named.add(envelope.policy.model.secret);
    for (const name of named) {
      // hasOwn, not `in`: a rule naming "constructor" must not find Object.prototype's.
      if (!Object.hasOwn(envelope.secrets, name)) {
        ctx.addIssue({ code: "custom", path: ["secrets"], message: `no value for the secret ${name}` });
      }
    }
    // The proxy holds only the secrets its rules (and its model lane) use.
    for (const name of Object.keys(envelope.secrets)) {
      if (!named.has(name)) {
        ctx.addIssue({ code: "custom", path: ["secrets", name], message: "no rule uses this secret" });
      }
    }
  });

/** The policy envelope, checked whole: its secrets, and its document's routing (policy-routing.ts). */
export const PolicyEnvelope = PolicyEnvelopeShape.superRefine((envelope, ctx) =>
  followsFromEntries(envelope.policy, ctx, ["policy"]),
);
export type PolicyEnvelope = z.infer<typeof PolicyEnvelope>;

// ---- audit ----

/** Per array of a batch. The proxy aggregates by host, so this is a count of distinct hosts. */
export const MAX_AUDIT_ENTRIES = 10_000;
/** The control plane refuses a larger body before parsing it (413). */
export const MAX_AUDIT_BODY_BYTES = 8 * 1024 * 1024;

const CanonicalHost = z
  .string()
  .max(1024)
  .refine((h) => canonicalHost(h) === h, "not a canonical host (lowercase, punycode, no port)");
const Instant = z.iso.datetime();
const Count = z.number().int().min(1);

const seenInOrder = (row: { firstSeen: string; lastSeen: string }) =>
  Date.parse(row.firstSeen) <= Date.parse(row.lastSeen);

export const EgressRoute = z.enum(["direct", "tunnel", "refused"]);
export type EgressRoute = z.infer<typeof EgressRoute>;

export const AuditSource = z.enum(["proxy", "local_agent"]);
export type AuditSource = z.infer<typeof AuditSource>;

export const BlockedHostRow = z
  .strictObject({ host: CanonicalHost, count: Count, firstSeen: Instant, lastSeen: Instant })
  .refine(seenInOrder, { message: "firstSeen is after lastSeen", path: ["lastSeen"] });
export type BlockedHostRow = z.infer<typeof BlockedHostRow>;

export const EgressRouteRow = z
  .strictObject({
    host: CanonicalHost,
    route: EgressRoute,
    count: Count,
    firstSeen: Instant,
    lastSeen: Instant,
  })
  .refine(seenInOrder, { message: "firstSeen is after lastSeen", path: ["lastSeen"] });
export type EgressRouteRow = z.infer<typeof EgressRouteRow>;

/** Which limit of a host entry or rule a refused request was outside (case N3). */
export const LimitKind = z.enum(LIMIT_KINDS);
export type LimitKind = z.infer<typeof LimitKind>;

/**
 * Requests refused for a method or path limit, per host, method and limit. Never the path (the
 * seed's promise: audit rows carry hosts, not what was asked of them).
 */
export const LimitRefusalRow = z
  .strictObject({
    host: CanonicalHost,
    method: z.string().regex(/^[!#$%&'*+\-.^_`|~0-9A-Z]{1,32}$/, "an uppercase method token"),
    limit: LimitKind,
    count: Count,
    firstSeen: Instant,
    lastSeen: Instant,
  })
  .refine(seenInOrder, { message: "firstSeen is after lastSeen", path: ["lastSeen"] });
export type LimitRefusalRow = z.infer<typeof LimitRefusalRow>;

/**
 * A rule's placeholder sent toward a host other than its rule's: it went out as it was (never
 * swapped), and is counted per host and secret name (case N2). Never the value or where it was.
 */
export const StrayPlaceholderRow = z
  .strictObject({
    host: CanonicalHost,
    secret: SecretName,
    count: Count,
    firstSeen: Instant,
    lastSeen: Instant,
  })
  .refine(seenInOrder, { message: "firstSeen is after lastSeen", path: ["lastSeen"] });
export type StrayPlaceholderRow = z.infer<typeof StrayPlaceholderRow>;

/**
 * The model lane's calls, by the endpoint the caller spoke (OpenAI's chat completions and
 * responses, Anthropic's messages), whatever the provider speaks.
 */
export const ModelEndpoint = z.enum(MODEL_ENDPOINTS);
export type ModelEndpoint = z.infer<typeof ModelEndpoint>;

/** Per call: 0 when the provider reported no usage (the call is still recorded). */
const Tokens = z
  .number()
  .int()
  .min(0)
  .max(2 ** 40);

/**
 * One call through the model lane: which model and provider, the status and the token counts.
 * Never a prompt, an output, a header or a path beyond the endpoint's name.
 */
export const ModelCallRow = z.strictObject({
  /** Unique per call (the proxy's id): a call counted twice is stored once. */
  callId: z.string().regex(/^[A-Za-z0-9_-]{8,64}$/),
  at: Instant,
  model: z.string().min(1).max(128),
  provider: z.string().min(1).max(64),
  endpoint: ModelEndpoint,
  stream: z.boolean(),
  status: z.number().int().min(100).max(599),
  inputTokens: Tokens,
  outputTokens: Tokens,
  /** Of inputTokens, how many the provider read from its prompt cache (0 when not reported). */
  cachedInputTokens: Tokens.default(0),
  /**
   * Why the lane answered itself without calling upstream (over_budget, model_not_declared...),
   * or null when the provider answered. A refused call is recorded too (with 0 tokens).
   */
  refused: z
    .string()
    .regex(/^[a-z_]{1,64}$/)
    .nullable()
    .default(null),
  ms: z.number().int().min(0),
});
export type ModelCallRow = z.infer<typeof ModelCallRow>;

/**
 * One audit delivery: counts per host, aggregated over a flush interval. Strict, and there is
 * deliberately no field that could carry a path, query, header or body. A host (or host and
 * route) appears once per batch, so that a batch has one meaning however the rows are summed.
 */
export const AuditBatch = z
  .strictObject({
    schema: z.literal(1),
    runId: RunId,
    batchId: BatchId,
    source: AuditSource,
    createdAt: Instant,
    blockedHosts: z.array(BlockedHostRow).max(MAX_AUDIT_ENTRIES),
    egressRoutes: z.array(EgressRouteRow).max(MAX_AUDIT_ENTRIES),
    modelCalls: z.array(ModelCallRow).max(MAX_AUDIT_ENTRIES).default([]),
    limitRefusals: z.array(LimitRefusalRow).max(MAX_AUDIT_ENTRIES).default([]),
    strayPlaceholders: z.array(StrayPlaceholderRow).max(MAX_AUDIT_ENTRIES).default([]),
  })
  .superRefine((batch, ctx) => {
    const seen = new Set<string>();
    batch.blockedHosts.forEach((row, i) => {
      if (seen.has(row.host)) {
        ctx.addIssue({ code: "custom", path: ["blockedHosts", i, "host"], message: "host listed twice" });
      }
      seen.add(row.host);
    });
    seen.clear();
    batch.egressRoutes.forEach((row, i) => {
      const key = `${row.route} ${row.host}`;
      if (seen.has(key)) {
        ctx.addIssue({ code: "custom", path: ["egressRoutes", i], message: "host and route listed twice" });
      }
      seen.add(key);
    });
    seen.clear();
    batch.limitRefusals.forEach((row, i) => {
      const key = `${row.host} ${row.method} ${row.limit}`;
      if (seen.has(key)) {
        ctx.addIssue({
          code: "custom",
          path: ["limitRefusals", i],
          message: "host, method and limit listed twice",
        });
      }
      seen.add(key);
    });
    seen.clear();
    batch.strayPlaceholders.forEach((row, i) => {
      const key = `${row.host} ${row.secret}`;
      if (seen.has(key)) {
        ctx.addIssue({
          code: "custom",
          path: ["strayPlaceholders", i],
          message: "host and secret listed twice",
        });
      }
      seen.add(key);
    });
  });
export type AuditBatch = z.infer<typeof AuditBatch>;

// ---- ready ----

const Port = z.number().int().min(1).max(65_535);

/** Body of `POST readyPath(runId)`: the proxy is listening and the work sandbox may trust its CA. */
export const ProxyReady = z.strictObject({
  caCertPem: z
    .string()
    .max(16_384)
    .regex(
      /^-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]+-----END CERTIFICATE-----\r?\n?$/,
      "one PEM certificate",
    ),
  /** SHA-256 of the CA certificate's DER, lowercase hex. */
  caFingerprint256: z.string().regex(/^[0-9a-f]{64}$/, "64 lowercase hex digits"),
  /** The policy version in force, or null when the proxy has none (it then denies everything). */
  policyVersion: z.number().int().min(0).nullable(),
  listeners: z
    .strictObject({ tls: Port, http: Port, explicit: Port })
    .refine((l) => new Set([l.tls, l.http, l.explicit]).size === 3, "the three listeners share a port"),
});
export type ProxyReady = z.infer<typeof ProxyReady>;

// ---- audit signing (Standard Webhooks: HMAC-SHA256 over `id.timestamp.body`) ----

/** `whsec_` + base64 of at least 24 random bytes, as the standardwebhooks library reads it. */
export const AuditKey = z
  .string()
  .regex(/^whsec_(?:[A-Za-z0-9+/]{4}){8,}(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/, "not an audit key");

/** A fresh per-run audit key (32 random bytes). */
export function newAuditKey(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(32));
  return `whsec_${btoa(String.fromCharCode(...bytes))}`;
}

// A type alias, not an interface: it then fits Record<string, string> (fetch headers, verify).
export type AuditSignatureHeaders = {
  "webhook-id": string;
  "webhook-timestamp": string;
  "webhook-signature": string;
};

function webhook(auditKey: string): Webhook {
  // A malformed key is a configuration error, not a bad request: say so, without the key.
  if (!AuditKey.safeParse(auditKey).success) throw new TypeError("the audit key is not whsec_ + base64");
  return new Webhook(auditKey);
}

/** The headers that sign `rawBody` (the exact bytes sent) as the batch `batchId` at `timestamp`. */
export function signAuditBatch(
  auditKey: string,
  batchId: string,
  timestamp: Date,
  rawBody: string,
): AuditSignatureHeaders {
  if (!ID.test(batchId)) throw new TypeError("not a batch id");
  return {
    [AUDIT_ID_HEADER]: batchId,
    [AUDIT_TIMESTAMP_HEADER]: String(Math.floor(timestamp.getTime() / 1000)),
    [AUDIT_SIGNATURE_HEADER]: webhook(auditKey).sign(batchId, timestamp, rawBody),
  };
}

/**
 * Why a delivered batch was refused. `unauthenticated`: signature missing, wrong, or outside
 * the 5-minute window (→ 401); `invalid_batch`: signed, but not an AuditBatch or not the batch
 * the signature names (→ 400); `wrong_run`: names a run other than the one addressed (→ 403).
 */
export type AuditRefusal = "unauthenticated" | "invalid_batch" | "wrong_run";

export class AuditVerificationError extends Error {
  constructor(
    readonly code: AuditRefusal,
    message: string,
  ) {
    super(message);
    this.name = "AuditVerificationError";
  }
}

export type HeaderSource =
  | { get(name: string): string | null }
  | Readonly<Record<string, string | readonly string[] | undefined>>;

function header(headers: HeaderSource, name: string): string | undefined {
  if (typeof headers.get === "function")
    return (headers as { get(n: string): string | null }).get(name) ?? undefined;
  const record = headers as Readonly<Record<string, string | readonly string[] | undefined>>;
  const key = Object.keys(record).find((k) => k.toLowerCase() === name);
  const value = key === undefined ? undefined : record[key];
  // A repeated header is ambiguous: treat it as absent.
  return typeof value === "string" ? value : undefined;
}

/**
 * Checks the signature over the raw body (constant-time, several `v1,` signatures accepted for
 * key rotation, timestamp within 5 minutes), then the batch itself: strict schema, the signed id
 * is the batch's id, and (when given) the run is the one addressed. Throws AuditVerificationError.
 */
export function verifyAuditBatch(
  auditKey: string,
  headers: HeaderSource,
  rawBody: string,
  expect: { runId?: string } = {},
): AuditBatch {
  const unauthenticated = (message: string) => new AuditVerificationError("unauthenticated", message);
  const id = header(headers, AUDIT_ID_HEADER);
  const timestamp = header(headers, AUDIT_TIMESTAMP_HEADER);
  const signature = header(headers, AUDIT_SIGNATURE_HEADER);
  if (id === undefined || timestamp === undefined || signature === undefined) {
    throw unauthenticated("missing webhook-id, webhook-timestamp or webhook-signature");
  }
  if (!ID.test(id)) throw unauthenticated("webhook-id is not a batch id");
  // The library reads the timestamp with parseInt, which accepts "123abc": insist on digits.
  if (!/^[0-9]{1,12}$/.test(timestamp)) throw unauthenticated("webhook-timestamp is not an integer");
  if (signature.length > 4096) throw unauthenticated("webhook-signature is too long");
  if (rawBody.length > MAX_AUDIT_BODY_BYTES)
    throw new AuditVerificationError("invalid_batch", "body too large");

  const hook = webhook(auditKey);
  try {
    hook.verify(
      rawBody,
      {
        [AUDIT_ID_HEADER]: id,
        [AUDIT_TIMESTAMP_HEADER]: timestamp,
        [AUDIT_SIGNATURE_HEADER]: signature,
      },
      { jsonParse: false },
    );
  } catch (error) {
    if (error instanceof WebhookVerificationError) throw unauthenticated(error.message);
    throw unauthenticated("the signature could not be checked");
  }

  let json: unknown;
  try {
    json = JSON.parse(rawBody);
  } catch {
    throw new AuditVerificationError("invalid_batch", "the body is not JSON");
  }
  const parsed = AuditBatch.safeParse(json);
  if (!parsed.success) {
    throw new AuditVerificationError("invalid_batch", describeIssues(parsed.error.issues));
  }
  const batch = parsed.data;
  if (batch.batchId !== id) {
    throw new AuditVerificationError("invalid_batch", "webhook-id does not name this batch");
  }
  if (expect.runId !== undefined && batch.runId !== expect.runId) {
    throw new AuditVerificationError("wrong_run", "the batch names another run");
  }
  return batch;
}

/**
 * A short account of schema issues: path and message only. zod's messages do not echo the input
 * value, so this is safe to log even for an envelope that carries secrets.
 */
export function describeIssues(issues: readonly z.core.$ZodIssue[], max = 3): string {
  const shown = issues
    .slice(0, max)
    .map((issue) => `${issue.path.length > 0 ? issue.path.join(".") : "(root)"}: ${issue.message}`);
  const more = issues.length > max ? ` (+${issues.length - max} more)` : "";
  return `${shown.join("; ")}${more}`;
}
