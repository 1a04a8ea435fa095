import { z } from "zod";

// The e2b backend's settings, from the Worker's env (docs/e2b.md says what each is), the metadata
// it puts on every sandbox, and its bounds.

const setting = (name: string) => z.string({ error: `${name} is not set` }).min(1, `${name} is not set`);
const optionalUrl = (name: string) =>
  z
    .union([z.literal(""), z.url({ protocol: /^https?$/, error: `${name} is not an http(s) URL` })])
    .optional();

export const E2bEnv = z.object({
  E2B_API_KEY: setting("E2B_API_KEY").min(16, "E2B_API_KEY is too short"),
  // The proxy sandbox reaches the control plane there, over the internet.
  PUBLIC_URL: z.url({ protocol: /^https$/, error: "PUBLIC_URL is not an https URL" }),
  E2B_PROXY_TEMPLATE: setting("E2B_PROXY_TEMPLATE"),
  E2B_WORK_TEMPLATE: setting("E2B_WORK_TEMPLATE"),
  /**
   * The image E2B_WORK_TEMPLATE is built from, pinned (`<REGISTRY_URL host>/<repo>@sha256:…`):
   * setup images' base. Empty: E2B keeps no setup images (baseImage says why).
   */
  E2B_WORK_IMAGE: z.string().optional(),
  /** Empty: E2B's cloud (https://api.<domain>). */
  E2B_API_URL: optionalUrl("E2B_API_URL"),
  E2B_DOMAIN: z
    .union([z.literal(""), z.string().regex(/^[a-z0-9.-]+$/, "E2B_DOMAIN is not a domain")])
    .optional(),
  /** envd's address, for a self-hosted E2B or a contract server (the SDK's `sandboxUrl`). */
  E2B_SANDBOX_URL: optionalUrl("E2B_SANDBOX_URL"),
});
export type E2bEnv = z.infer<typeof E2bEnv>;

/** Metadata on every sandbox: how list() maps E2B's sandboxes back, and whose they are. */
export const META = {
  /** This deployment (PUBLIC_URL's origin): another deployment on the same E2B team is not ours. */
  deployment: "bw-deployment",
  run: "bw-run",
  kind: "bw-kind",
  sandbox: "bw-sandbox",
  /** work/task/orchestrator: the run's proxy sandbox and the routing they were made with. */
  proxy: "bw-proxy",
  routing: "bw-routing",
  /** work/task/orchestrator made with resources: RLIMIT_NPROC of its execute commands. */
  pids: "bw-pids",
  /** "true": a setup image's builder (captureLayer reads its working directory after seal). */
  capture: "bw-capture",
} as const;

/** A sandbox's life at a time; it is extended while the run uses it, and it pauses when it ends. */
export const SANDBOX_TTL_MS = 60 * 60_000;
export const KEEPALIVE_EVERY_MS = 5 * 60_000;
export const MAX_POLL_WAIT_MS = 5_000;
/** Longest a runner call may take beyond its own wait (envd's stream deadline). */
export const RUNNER_DEADLINE_MS = 30_000;
export const READY_DEADLINE_MS = 15_000;
/** Longest an unpack or a collect may take in the sandbox. */
export const TRANSFER_DEADLINE_MS = 10 * 60_000;
/** Longest the wiring's rewrite may take. */
export const REINSTALL_DEADLINE_MS = 60_000;
export const STDIN_CHUNK = 256 * 1024;
/** The bridge's local end in a work sandbox: what the hosts file and the redirect point at. */
export const WORK_PROXY_ADDRESS = "127.0.0.1";
/** The runner's exec id for the bridge in each sandbox (one per sandbox, idempotent). */
export const BRIDGE_EXEC_ID = "bw-bridge";
