import { z } from "zod";
import { RunId } from "./proxy-wire";

// What a run's proxy shows of itself while it runs or lingers: counters, its last decisions, the
// policy version in force and how its audit delivery stands. The proxy serves it on the loopback
// of its own sandbox (GET /view); the control plane reads it by running `bw-proxy-view` in the
// proxy sandbox (through the broker's exec), which prints it as one JSON line. Host, port, method
// and the proxy's own reason only: never a header value, a path, a body or a secret.

/** How many decisions `recent` keeps. */
export const VIEW_RECENT_LIMIT = 100;

const Count = z.number().int().min(0);

/**
 * The proxy's ways in: transparent TLS and plain HTTP (hosts file, catch-all DNAT), the explicit
 * proxy port, and the direct listeners for connections dialled by address (default routing, I4).
 */
export const PROXY_LISTENERS = ["tls", "http", "explicit", "direct-tls", "direct-http"] as const;
export type ProxyListener = (typeof PROXY_LISTENERS)[number];

export const ViewDecision = z.strictObject({
  /** When the decision was logged (the request's end), ISO 8601. */
  at: z.iso.datetime(),
  listener: z.enum(PROXY_LISTENERS),
  host: z.string().nullable(),
  port: z.number().int().min(0).max(65_535).nullable(),
  method: z.string(),
  decision: z.enum(["allow", "block", "refuse", "error"]),
  reason: z.string(),
  status: z.number().int(),
  /** Index of the credential rule applied, or null: none was. */
  rule: z.number().int().min(0).nullable(),
  policyVersion: z.number().int().min(0).nullable(),
  ms: z.number().min(0),
});
export type ViewDecision = z.infer<typeof ViewDecision>;

export const ProxyView = z.strictObject({
  runId: RunId,
  /** When the proxy started, and when this view was taken (ISO 8601). */
  startedAt: z.iso.datetime(),
  generatedAt: z.iso.datetime(),
  /** The policy in force now: its version, null when none is (the proxy then denies everything). */
  policyVersion: z.number().int().min(0).nullable(),
  policyState: z.enum(["none", "invalid", "ready"]),
  /** Since start. `injected`: allowed requests that carried a vault credential. */
  counts: z.strictObject({
    requests: Count,
    allow: Count,
    block: Count,
    refuse: Count,
    error: Count,
    injected: Count,
  }),
  /** The last VIEW_RECENT_LIMIT decisions, oldest first. */
  recent: z.array(ViewDecision).max(VIEW_RECENT_LIMIT),
  /** The audit reporter's counters, and what waits in its spool. */
  audit: z.strictObject({
    rowsRecorded: Count,
    rowsSent: Count,
    rowsRejected: Count,
    rowsRefused: Count,
    batchesSent: Count,
    batchesRejected: Count,
    pendingBatches: Count,
    /** False while the spool is full: the proxy refuses new egress. */
    accepting: z.boolean(),
  }),
});
export type ProxyView = z.infer<typeof ProxyView>;

/** The path the proxy serves the view on (127.0.0.1:BW_VIEW_PORT). */
export const VIEW_PATH = "/view";
/** BW_VIEW_PORT's default. */
export const DEFAULT_VIEW_PORT = 9901;
