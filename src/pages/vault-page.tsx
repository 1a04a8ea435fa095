import { Hono } from "hono";
import type { PageEnv } from "./context";

// The vault page (/manage/vault): to be built (issue 6).
export const vaultPageRoutes = new Hono<PageEnv>();
