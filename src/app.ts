import { consoleLog } from "@benchwright/shared/contract/log";
import type { Context } from "hono";
import { bodyLimit } from "hono/body-limit";
import { createMiddleware } from "hono/factory";
import { HTTPException } from "hono/http-exception";
import { describeKeyScope } from "./auth/describe-scope";
import { requireApiKey } from "./auth/middleware";
import { ConfigError, loadConfig } from "./config";
import type { AppEnv } from "./context";
import { openDb } from "./db/client";
import { isDatabaseUnavailable } from "./db/errors";
import { ApiError, problem } from "./errors";
import { idempotency } from "./idempotency/middleware";
import { describeIdempotency, honoPath, IDEMPOTENT_POSTS, WITHHELD_FROM_REPLAY } from "./idempotency/routes";
import { describeRateLimit, rateLimit } from "./limits/rate-limit";
import { pageRoutes } from "./pages/routes";
import { newRouter } from "./router";
import { apiKeysRoutes } from "./routes/api-keys";
import { blockedHostsRoutes } from "./routes/blocked-hosts";
import { bugReportsRoutes } from "./routes/bug-reports";
import { bundlesRoutes } from "./routes/bundles";
import { computeRoutes } from "./routes/compute";
import { egressAgentRoutes, egressTokenRoutes } from "./routes/egress-agent";
import { internalRoutes, type OnProxyReady } from "./routes/internal";
import { meRoutes } from "./routes/me";
import { notificationsRoutes } from "./routes/notifications";
import { registryTokenRoutes } from "./routes/registry-token";
import { runArtifactsRoutes } from "./routes/run-artifacts";
import { runAuditRoutes } from "./routes/run-audit";
import { runEventsRoutes } from "./routes/run-events";
import { runsRoutes } from "./routes/runs";
import { setupImagesRoutes } from "./routes/setup-images";
import { dryRunRoutes } from "./routes/vault-dry-run";
import { hostsRoutes } from "./routes/vault-hosts";
import { modelsRoutes } from "./routes/vault-models";
import { previewRoutes } from "./routes/vault-preview";
import { rulesRoutes } from "./routes/vault-rules";
import { secretsRoutes } from "./routes/vault-secrets";
import { deliveryRoutes, webhooksRoutes } from "./routes/webhooks";

const MAX_BODY_BYTES = 64 * 1024;
const DOCUMENT_PATH = "/v1/openapi.json";

export interface AppOptions {
  /** Told after a run's proxy reported ready on the internal API (default: nobody). */
  onProxyReady?: OnProxyReady;
}

// Configuration and a per-request database handle, closed when the request is done.
const withDatabase = createMiddleware<AppEnv>(async (c, next) => {
  const config = loadConfig(c.env);
  c.set("config", config);
  const { db, close } = openDb(config);
  c.set("db", db);
  try {
    await next();
  } finally {
    c.executionCtx.waitUntil(close().catch(() => {}));
  }
});

export function createApp(options: AppOptions = {}) {
  const app = newRouter();

  app.use("*", async (c, next) => {
    const requestId = `req_${crypto.randomUUID().replaceAll("-", "")}`;
    c.set("requestId", requestId);
    await next();
    // A WebSocket handshake's answer (the egress tunnel) has immutable headers.
    if (c.res.status !== 101) c.res.headers.set("x-request-id", requestId);
  });

  const jsonBodyLimit = bodyLimit({
    maxSize: MAX_BODY_BYTES,
    onError: (c) => problem(c, "payload_too_large", `At most ${MAX_BODY_BYTES} bytes.`),
  });
  // A bundle upload has its own, larger bound (BUNDLE_MAX_BYTES), checked by its route.
  app.use("/v1/*", (c, next) =>
    c.req.method === "POST" && c.req.path === "/v1/bundles" ? next() : jsonBodyLimit(c, next),
  );

  // Everything under /v1 but the document needs the database and an API key.
  app.use("/v1/*", (c, next) => (c.req.path === DOCUMENT_PATH ? next() : withDatabase(c, next)));
  app.use("/v1/*", (c, next) => (c.req.path === DOCUMENT_PATH ? next() : requireApiKey(c, next)));
  // Then, per API key: its request rate (case K4), and retries of creating POSTs (case K2). A
  // refused request is never claimed for its Idempotency-Key. The largest body a covered route
  // takes is a bundle's; the others are held to MAX_BODY_BYTES above.
  app.use("/v1/*", (c, next) => (c.req.path === DOCUMENT_PATH ? next() : rateLimit(c, next)));
  const maxBody = (c: Context<AppEnv>) => c.var.config.bundleLimits.maxUploadBytes;
  for (const path of IDEMPOTENT_POSTS) {
    app.use(honoPath(path), idempotency(maxBody, WITHHELD_FROM_REPLAY[path] ?? []));
  }
  // The run proxies' API: the database too, and each route checks the run's proxy token.
  app.use("/internal/*", withDatabase);
  // Webhook deliveries: the database too; the delivery's signature is its credential.
  app.use("/hooks/*", withDatabase);
  // Compute control from inside a run: the database too; each route checks the run's capability
  // (src/compute/middleware.ts).
  app.use("/compute/*", withDatabase);
  // The user's local egress agent: the database too; its routes check the run's egress token.
  app.use("/egress-agent/*", withDatabase);
  // The pages: the database too; each page checks its session (src/pages/routes.tsx).
  for (const path of ["/", "/login", "/logout", "/manage/*", "/runs", "/runs/*"]) {
    app.use(
      path,
      bodyLimit({ maxSize: MAX_BODY_BYTES, onError: (c) => c.text("Request body too large.", 413) }),
      withDatabase,
    );
  }

  app.route("/v1", meRoutes);
  app.route("/v1", apiKeysRoutes);
  app.route("/v1/vault", secretsRoutes);
  app.route("/v1/vault", rulesRoutes);
  app.route("/v1/vault", hostsRoutes);
  app.route("/v1/vault", modelsRoutes);
  app.route("/v1/vault", previewRoutes);
  app.route("/v1/vault", dryRunRoutes);
  app.route("/v1", runsRoutes);
  app.route("/v1", runAuditRoutes);
  app.route("/v1", runEventsRoutes);
  app.route("/v1", runArtifactsRoutes);
  app.route("/v1", egressTokenRoutes);
  app.route("/v1", blockedHostsRoutes);
  app.route("/v1", webhooksRoutes);
  app.route("/v1", notificationsRoutes);
  app.route("/v1", bugReportsRoutes);
  app.route("/v1", bundlesRoutes);
  app.route("/v1", setupImagesRoutes);
  // Outside /v1 and its document: only a run's proxy calls it.
  app.route("/internal", internalRoutes({ onProxyReady: options.onProxyReady }));
  // Outside /v1 and its document: senders call it without an API key.
  app.route("/hooks", deliveryRoutes);
  // Outside /v1 and its document: a run's work or orchestrator sandbox calls it with its capability.
  app.route("/compute", computeRoutes);
  // Outside /v1 and its document: the user's egress agent calls it with its run's egress token.
  app.route("/egress-agent", egressAgentRoutes);
  // Outside /v1 and its document: a sandbox0 node's kubelet calls it with a pull credential.
  app.route("/registry", registryTokenRoutes);
  app.route("/", pageRoutes);

  describeIdempotency(app);
  describeRateLimit(app, DOCUMENT_PATH);
  describeKeyScope(app);
  app.openAPIRegistry.registerComponent("securitySchemes", "apiKey", { type: "http", scheme: "bearer" });
  app.doc31(DOCUMENT_PATH, {
    openapi: "3.1.0",
    info: { title: "Benchwright boundary API", version: "1" },
    security: [{ apiKey: [] }],
  });

  app.notFound((c) => problem(c, "route_not_found", `${c.req.method} ${c.req.path} is not a route.`));
  app.onError((err, c) => {
    if (err instanceof ApiError) return problem(c, err.code, err.detail, err.retryAfter, err.headers);
    if (err instanceof ConfigError) {
      consoleLog("error", { event: "config_invalid", detail: err.message });
      return problem(c, "config_invalid", err.message);
    }
    // 400: the body did not parse; 415: @hono/zod-openapi's media-type gate (a body sent without
    // Content-Type: application/json). Both are the caller's mistake, not a 500.
    if (err instanceof HTTPException && (err.status === 400 || err.status === 415)) {
      return problem(c, "invalid_json", "The body must be JSON (Content-Type: application/json).");
    }
    const requestId = c.get("requestId");
    if (isDatabaseUnavailable(err)) {
      consoleLog("error", { event: "database_unavailable", requestId, error: err.name });
      return problem(c, "database_unavailable", "The database did not answer in time; retry shortly.");
    }
    // Only the error's class: messages of driver errors can quote parameters.
    consoleLog("error", { event: "internal_error", requestId, error: err.name });
    return problem(c, "internal_error", `Something went wrong; quote ${requestId} when reporting it.`);
  });
  return app;
}
