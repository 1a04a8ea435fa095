import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import { createMiddleware } from "hono/factory";
import { z } from "zod";
import { type ComputeEnv, requireCapability } from "../compute/middleware";
import { ApiError, problem, unwrap } from "../errors";
import { ContentHash, confirmPush, type Registry, requestImage } from "../images/cache";
import { loadRegistrySettings } from "../images/config";
import { registryClient } from "../images/registry";

// The image build cache from inside a run (docs/image-cache.md), with the run's compute
// capability. Not in /v1 nor its OpenAPI document: only a run's work or orchestrator sandbox
// calls it. Every answer is about the capability's own environment: another environment's
// entry is not found, whatever hash is asked for.

const MAX_BODY_BYTES = 4 * 1024;

const ImageRequest = z.object({ contentHash: ContentHash }).strict();

async function registryOf(env: Env): Promise<Registry> {
  const settings = await loadRegistrySettings(env);
  if (!settings) {
    throw new ApiError(
      "registry_not_configured",
      "This deployment has no image registry (REGISTRY_URL is empty).",
    );
  }
  return { settings, client: registryClient(settings) };
}

function parseHash(value: unknown): string {
  const parsed = ContentHash.safeParse(value);
  if (!parsed.success) {
    throw new ApiError("invalid_content_hash", `contentHash: ${parsed.error.issues[0]?.message}`);
  }
  return parsed.data;
}

function readRequest(text: string, contentType: string | undefined): string {
  if (!contentType?.toLowerCase().startsWith("application/json")) {
    throw new ApiError("invalid_json", "The body must be JSON (Content-Type: application/json).");
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    throw new ApiError("invalid_json", "The body must be JSON (Content-Type: application/json).");
  }
  const parsed = ImageRequest.safeParse(json);
  if (parsed.success) return parsed.data.contentHash;
  const unknown = parsed.error.issues.find((i) => i.code === "unrecognized_keys");
  if (unknown) throw new ApiError("unknown_field", `${unknown.message}; the body is { contentHash } only.`);
  const hashIssue = parsed.error.issues.find((i) => i.path[0] === "contentHash");
  if (hashIssue) throw new ApiError("invalid_content_hash", `contentHash: ${hashIssue.message}`);
  throw new ApiError("invalid_request", parsed.error.issues.map((i) => i.message).join("; "));
}

// Answers that carry a push token are not to be kept by anything between the sandbox and us.
const NO_STORE = { "cache-control": "no-store" };

// The capability check for this file's paths, skipped only when a middleware mounted before ours
// on /compute already did it for this request (one database lookup, not two).
const capability = createMiddleware<ComputeEnv>((c, next) =>
  c.get("capability") ? next() : requireCapability(c, next),
);

export const computeImagesRoutes = new Hono<ComputeEnv>()
  .use("/images", capability)
  .use("/images/*", capability)
  .post(
    "/images",
    bodyLimit({
      maxSize: MAX_BODY_BYTES,
      onError: (c) => problem(c, "payload_too_large", `At most ${MAX_BODY_BYTES} bytes.`),
    }),
    async (c) => {
      const contentHash = readRequest(await c.req.text(), c.req.header("content-type"));
      const registry = await registryOf(c.env);
      const answer = unwrap(await requestImage(c.var.db, registry, c.var.capability, contentHash));
      return c.json(answer, 200, NO_STORE);
    },
  )
  .post("/images/:contentHash/pushed", async (c) => {
    const contentHash = parseHash(c.req.param("contentHash"));
    const registry = await registryOf(c.env);
    const built = unwrap(await confirmPush(c.var.db, registry, c.var.capability, contentHash));
    return c.json(built, 200, NO_STORE);
  });
