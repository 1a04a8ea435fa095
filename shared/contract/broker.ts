import { z } from "zod";
import { AgentErrorCode } from "./local-agent";

// Why a sandbox broker call failed: the closed set of codes a broker answer carries across the
// Durable Object RPC boundary (src/broker/interface.ts), where an error's class and fields do not
// travel. Every compute backend's failure is one of these, so the coordinator tells "cannot
// isolate here" from "not built on this backend" from "try again" by the code, never by words.
// Pure zod: no Worker or Node import.

export const BrokerCode = z.enum([
  // What the local host agent answers with (its problem+json codes), kept as they are.
  ...AgentErrorCode.options,
  /** The backend has not got this capability yet (docs/e2b.md, docs/sandbox0.md). */
  "not_supported",
  /** The run's backend has no settings on this deployment (or no backend has that name). */
  "backend_not_configured",
  "backend_unreachable",
  /** The backend asked to slow down (rate limited): worth another try. */
  "backend_busy",
  /** The backend failed, or answered outside its contract. */
  "backend_error",
  "already_exists",
  "resources_unavailable",
  "sandbox_starting",
  /** e2b: the catch-all redirect could not be installed in a work or task sandbox. */
  "redirect_not_installed",
  /** sandbox0: the sandbox has no work pod (its proxy sandbox); answered inside the backend. */
  "pod_not_found",
  /** The run's bundle is not in the run's environment, or has no stored bytes. */
  "bundle_not_found",
  // A collected archive the broker could not store (src/runs/artifacts.ts ArtifactArchiveError).
  "archive_invalid",
  "archive_too_large",
  "archive_inconsistent",
  // Setup images (contract/setup-image.ts).
  /** The run's environment has no built setup image of that key (never another's: case P3). */
  "setup_image_not_found",
  /** The environment's setup images reached SETUP_IMAGE_MAX_ENVIRONMENT_MB. */
  "setup_images_full",
]);
export type BrokerCode = z.infer<typeof BrokerCode>;
