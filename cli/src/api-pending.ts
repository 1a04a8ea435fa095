import type { Schemas } from "./api";

// The shapes of the bundle and artifact routes (issue 20), written out from the design until the
// API's OpenAPI document carries them. Then `npm run openapi` puts them in api-types.ts, these
// become Schemas["..."] and `Api.call`, and this file goes: it is the one place that repeats them.

/** 201 (stored now) or 200 (already stored) from POST /v1/bundles. */
export interface Bundle {
  sha256: string;
  size: number;
  files: number;
  unpackedBytes: number;
  createdAt: string;
}

/** One file a run's commands left under $BW_OUT, stored. */
export interface Artifact {
  id: string;
  sandboxId: string;
  sandboxName: string;
  /** Relative to $BW_OUT, `/`-separated. */
  path: string;
  size: number;
  sha256: string;
}

/** A file that was not collected, and why (contract/bundle.ts CutReason). */
export interface CutArtifact {
  sandboxId: string;
  sandboxName: string;
  path: string;
  reason: "too_large" | "too_many" | "symlink" | "special" | "unreadable" | (string & {});
  size: number | null;
}

/** GET /v1/runs/{id}/artifacts */
export interface ArtifactList {
  artifacts: Artifact[];
  cut: CutArtifact[];
}

/** The run spec's fields for bundles and setup, not yet in Schemas["RunSpec"]. */
export interface RunSpecPending {
  /** The sha256 of a bundle uploaded to this environment. */
  bundle?: string;
  setup?: string[];
}

export type RunSpecWithBundle = Partial<Schemas["RunSpec"]> & RunSpecPending;
