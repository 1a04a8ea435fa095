import { consoleLog } from "@benchwright/shared/contract/log";
import { Hono } from "hono";
import type { AppEnv } from "../context";
import { ApiError, problem } from "../errors";
import { loadRegistrySettings } from "../images/config";
import { pullCredentialEnvironment } from "../images/pull-credential";
import { setupRepository } from "../images/push";
import { mintRegistryToken } from "../images/token";

// GET /registry/token: the registry's token realm, for pulls only (distribution's token
// authentication: `?service=…&scope=repository:<name>:<actions>`, Basic credentials). Its one
// client is a sandbox0 node's kubelet pulling a pod's setup image, with the environment's pull
// credential from the pull Secret the sandbox0 backend makes (images/pull-credential.ts). It
// answers a short token that can pull that environment's own repository and nothing else: a
// `push` asked for is left out of the token (the registry then refuses the push itself: case P2),
// and a scope naming any other repository (another environment's, the base image's, the catalog)
// is refused outright (case P3). The broker never calls it: it mints its own tokens.

/** Long enough for a kubelet's pull of one image; then useless. */
const PULL_TOKEN_TTL_SECONDS = 300;
const SCOPE = /^repository:([a-z0-9][a-z0-9._/-]{0,254}):([a-z*]+(?:,[a-z*]+)*)$/;

export const registryTokenRoutes = new Hono<AppEnv>().get("/token", async (c) => {
  const settings = await loadRegistrySettings(c.env);
  if (!settings) throw new ApiError("not_found", "This deployment keeps no images in a registry.");
  const environmentId = await pullCredentialEnvironment(
    c.env.REGISTRY_SIGNING_KEY ?? "",
    c.req.header("authorization"),
  );
  if (!environmentId) {
    const refused = problem(c, "unauthorized", "A setup images pull credential is required (Basic).");
    refused.headers.set("www-authenticate", 'Basic realm="benchwright registry"');
    return refused;
  }
  if (c.req.query("service") !== settings.service) {
    throw new ApiError(
      "invalid_request",
      "The service is not this deployment's registry (REGISTRY_SERVICE).",
    );
  }
  const own = setupRepository(settings, environmentId);
  let pull = false;
  for (const scope of (c.req.queries("scope") ?? []).flatMap((s) => s.split(" ")).filter(Boolean)) {
    const match = SCOPE.exec(scope);
    if (!match) throw new ApiError("invalid_request", "A scope is not repository:<name>:<actions>.");
    if (match[1] !== own) {
      throw new ApiError("unauthorized", "This credential pulls only its own environment's setup images.");
    }
    // Only pull is ever granted: push (or anything else) asked for is left out of the token.
    pull ||= (match[2] as string).split(",").includes("pull");
  }
  const issuedAt = new Date();
  const minted = await mintRegistryToken(
    settings.signingKey,
    {
      issuer: settings.issuer,
      service: settings.service,
      subject: `pull:${environmentId}`,
      access: pull ? [{ type: "repository", name: own, actions: ["pull"] }] : [],
      ttlSeconds: PULL_TOKEN_TTL_SECONDS,
    },
    issuedAt,
  );
  consoleLog("info", { event: "registry_pull_token", environmentId, jti: minted.jti, pull });
  c.header("cache-control", "no-store");
  return c.json({
    token: minted.token,
    access_token: minted.token,
    expires_in: PULL_TOKEN_TTL_SECONDS,
    issued_at: issuedAt.toISOString(),
  });
});
