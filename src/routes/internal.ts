import type { KeyRing } from "@benchwright/shared/contract/key-ring";
import { consoleLog } from "@benchwright/shared/contract/log";
import {
  type AuditBatch,
  AuditVerificationError,
  describeIssues,
  MAX_AUDIT_BODY_BYTES,
  ProxyReady,
  policyEtag,
  readBearer,
  verifyAuditBatch,
} from "@benchwright/shared/contract/proxy-wire";
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import { createMiddleware } from "hono/factory";
import type { z } from "zod";
import type { AppEnv } from "../context";
import { VaultDecryptError } from "../crypto/vault-crypto";
import type { Db } from "../db/types";
import { ApiError, type ErrorCode, problem } from "../errors";
import { findRunByProxyToken, type ProxyRun, readAuditKey } from "../runs/proxy-credentials";
import { storeAuditBatch, storeProxyReady } from "../runs/proxy-reports";
import { runPolicyEnvelope, vaultVersion } from "../runs/run-vault";
import { relayTo } from "./egress-agent";

// The control plane's internal API for a run's proxy (the wire contract in
// shared/contract/proxy-wire.ts; test/proxy/control-plane.ts is its contract double). Not part of
// /v1 nor of the public OpenAPI document. Every call carries the run's proxy token; the run in
// the path must be the token's run, else 404 as for a run that does not exist (case C2).

/** Told after a run's proxy reported ready (the run coordinator is notified through it). */
export type OnProxyReady = (env: Env, runId: string) => Promise<void> | void;

export interface InternalOptions {
  onProxyReady?: OnProxyReady | undefined;
}

type InternalEnv = {
  Bindings: AppEnv["Bindings"];
  Variables: AppEnv["Variables"] & { proxyRun: ProxyRun };
};

/** The ready body is a certificate and a few numbers. */
const MAX_READY_BODY_BYTES = 64 * 1024;

export function internalRoutes(options: InternalOptions = {}) {
  return (
    new Hono<InternalEnv>()
      .get("/runs/:runId/policy", proxyAuth({ endedRun: "refuse" }), async (c) => {
        const run = c.var.proxyRun;
        const headers = { "cache-control": "no-store" };
        // The version alone answers a poll whose copy is current: no secret is decrypted for it.
        const current = policyEtag(await vaultVersion(c.var.db, run.environmentId));
        if (etagMatches(c.req.header("if-none-match"), current)) {
          return c.body(null, 304, { ...headers, etag: current });
        }
        const envelope = await runPolicyEnvelope(c.var.db, c.var.config.keyRing, run);
        if (!envelope.ok) throw new ApiError(envelope.error.code, envelope.error.detail);
        return c.json(envelope.value, 200, { ...headers, etag: policyEtag(envelope.value.policy.version) });
      })
      .post(
        "/runs/:runId/ready",
        proxyAuth({ endedRun: "refuse" }),
        limit(MAX_READY_BODY_BYTES),
        async (c) => {
          const ready = parseBody(ProxyReady, await c.req.text());
          await storeProxyReady(c.var.db, c.var.proxyRun.id, ready);
          // After the write: a notified coordinator reads what was just stored. Called on every
          // ready call (also a retried one), so a notification lost with a failed call is re-sent.
          await options.onProxyReady?.(c.env, c.var.proxyRun.id);
          return c.body(null, 204);
        },
      )
      // The proxy's end of the egress tunnel (shared/contract/tunnel.ts): handed to the run's relay.
      .get("/runs/:runId/tunnel", proxyAuth({ endedRun: "refuse" }), (c) =>
        relayTo(c.env, c.req.raw, c.var.proxyRun.id, "proxy"),
      )
      // Batches of an ended run are accepted while its token is not revoked: the proxy flushes
      // its spool when it is shut down, which is when the run is ending (docs/design-notes.md).
      .post(
        "/runs/:runId/audit",
        proxyAuth({ endedRun: "accept" }),
        limit(MAX_AUDIT_BODY_BYTES),
        async (c) => {
          const run = c.var.proxyRun;
          const raw = await c.req.text();
          const key = await auditKeyOf(c.var.db, c.var.config.keyRing, run);
          let batch: AuditBatch;
          try {
            batch = verifyAuditBatch(key, c.req.raw.headers, raw, { runId: run.id });
          } catch (error) {
            if (!(error instanceof AuditVerificationError)) throw error;
            throw new ApiError(REFUSAL_CODES[error.code], `The audit batch was refused: ${error.message}.`);
          }
          if (!(await storeAuditBatch(c.var.db, run, batch))) {
            throw new ApiError("already_stored", `Batch ${batch.batchId} of this run is stored already.`);
          }
          return c.body(null, 204);
        },
      )
  );
}

const REFUSAL_CODES: Record<AuditVerificationError["code"], ErrorCode> = {
  unauthenticated: "invalid_signature",
  invalid_batch: "invalid_request",
  wrong_run: "wrong_run",
};

// ---- authentication ----

/**
 * `Authorization: Bearer <proxy token>` → the token's run, which must be the run in the path.
 * Unknown, malformed or revoked tokens are 401; so is the token of an ended run, except where the
 * route accepts one (audit). Another run's id is 404, never 403: ids are not confirmed (C2).
 */
function proxyAuth(rules: { endedRun: "refuse" | "accept" }) {
  return createMiddleware<InternalEnv>(async (c, next) => {
    const token = readBearer(c.req.header("authorization"));
    if (token === null) {
      throw new ApiError("unauthorized", "Send the run's proxy token as `Authorization: Bearer <token>`.");
    }
    const run = await findRunByProxyToken(c.var.db, token);
    if (run === null || (run.ended && rules.endedRun === "refuse")) {
      throw new ApiError(
        "unauthorized",
        "The proxy token is not valid (unknown, revoked, or its run has ended).",
      );
    }
    if (c.req.param("runId") !== run.id) throw new ApiError("not_found", "No such run.");
    c.set("proxyRun", run);
    await next();
  });
}

function limit(maxSize: number) {
  return bodyLimit({
    maxSize,
    onError: (c) => problem(c, "payload_too_large", `At most ${maxSize} bytes.`),
  });
}

/** A JSON body checked against a strict schema, failing as the /v1 routes do. */
export function parseBody<T extends z.ZodType>(schema: T, raw: string): z.infer<T> {
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch {
    throw new ApiError("invalid_json", "The body must be JSON (Content-Type: application/json).");
  }
  const parsed = schema.safeParse(json);
  if (parsed.success) return parsed.data;
  const unknown = parsed.error.issues.some((i) => i.code === "unrecognized_keys");
  throw new ApiError(unknown ? "unknown_field" : "invalid_request", describeIssues(parsed.error.issues));
}

/** RFC 9110 If-None-Match (weak comparison): `*`, or a list of entity tags. */
function etagMatches(header: string | undefined, etag: string): boolean {
  if (header === undefined) return false;
  if (header.trim() === "*") return true;
  return header.split(",").some((tag) => tag.trim().replace(/^W\//, "") === etag);
}

// ---- audit ----

async function auditKeyOf(db: Db, keyRing: KeyRing, run: ProxyRun): Promise<string> {
  try {
    return await readAuditKey(db, keyRing, run);
  } catch (error) {
    const reason = error instanceof VaultDecryptError ? error.reason : "missing";
    consoleLog("error", { event: "audit_key_unreadable", runId: run.id, reason });
    throw new ApiError("vault_unreadable", `This run's audit key could not be read (${reason}).`);
  }
}
