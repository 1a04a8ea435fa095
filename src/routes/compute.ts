import { Hono } from "hono";
import { type ComputeEnv, requireCapability } from "../compute/middleware";

// Placeholder: filled in by issue 7's work (every route checks the run's compute capability).
export const computeRoutes = new Hono<ComputeEnv>().use("*", requireCapability);
