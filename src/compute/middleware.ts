import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../context";
import { ApiError } from "../errors";
import { type Capability, findCapability } from "./capability";

// `Authorization: Bearer bwc_...` on /compute: the run's compute-control capability. An unknown,
// expired, revoked or ended-run token gets the same 401 (the holder learns nothing more).

export type ComputeEnv = {
  Bindings: AppEnv["Bindings"];
  Variables: AppEnv["Variables"] & { capability: Capability };
};

/** The one refusal for a token that is not (or no longer) a live capability. */
export const unauthorized = () =>
  new ApiError(
    "unauthorized",
    "Send the run's compute capability as `Authorization: Bearer <token>` (it may have expired or been revoked).",
  );

export const requireCapability = createMiddleware<ComputeEnv>(async (c, next) => {
  const token = /^Bearer ([^\s]+)$/.exec(c.req.header("authorization") ?? "")?.[1];
  const capability = token ? await findCapability(c.var.db, token) : null;
  if (!capability) throw unauthorized();
  c.set("capability", capability);
  await next();
});
