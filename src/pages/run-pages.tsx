import { Hono } from "hono";
import type { PageEnv } from "./context";

// The run pages (/runs, /runs/:id): to be built (issue 6).
export const runPageRoutes = new Hono<PageEnv>();
