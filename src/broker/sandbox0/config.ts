import { z } from "zod";

// The sandbox0 backend's settings, from the Worker's env (docs/sandbox0.md says what each is).

const setting = (name: string) => z.string({ error: `${name} is not set` }).min(1, `${name} is not set`);

const LOOPBACK = new Set(["127.0.0.1", "localhost", "[::1]"]);
function isApiUrl(text: string): boolean {
  try {
    const u = new URL(text);
    // The token goes with every call: never in clear text off this machine.
    return u.protocol === "https:" || (u.protocol === "http:" && LOOPBACK.has(u.hostname));
  } catch {
    return false;
  }
}
function isHttpUrl(text: string): boolean {
  try {
    return ["http:", "https:"].includes(new URL(text).protocol);
  } catch {
    return false;
  }
}

export const Sandbox0Env = z.object({
  SANDBOX0_API_URL: setting("SANDBOX0_API_URL").refine(
    isApiUrl,
    "SANDBOX0_API_URL must be an https URL (http only on loopback)",
  ),
  SANDBOX0_TOKEN: setting("SANDBOX0_TOKEN"),
  SANDBOX0_NAMESPACE: setting("SANDBOX0_NAMESPACE").regex(
    /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/,
    "SANDBOX0_NAMESPACE is not a Kubernetes namespace name",
  ),
  SANDBOX0_PROXY_IMAGE: setting("SANDBOX0_PROXY_IMAGE"),
  SANDBOX0_WORK_IMAGE: setting("SANDBOX0_WORK_IMAGE"),
  PUBLIC_URL: setting("PUBLIC_URL").refine(isHttpUrl, "PUBLIC_URL is not an http(s) URL"),
});
export type Sandbox0Env = z.infer<typeof Sandbox0Env>;
