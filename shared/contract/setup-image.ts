import { z } from "zod";

// Setup images (issue 34): a run's setup commands run once per distinct setup, inside the
// boundary as always; the sandbox's filesystem changes are then kept as one layer over the work
// image, and every later sandbox with the same key (this run's tasks, later runs of the same
// environment) starts from it and skips the setup stage. This module is the contract every side
// shares: the key (case P1), the roles the broker hands out, and the stored layer's names.
// Pure zod and WebCrypto: no Worker or Node import.

/**
 * The version of the capture rules (what a layer leaves out, how owners map). Part of the key:
 * a change to the rules misses every layer made under the old ones.
 */
export const SETUP_IMAGE_FORMAT = 1;

/** A setup image's key: sha256 hex of its canonical inputs. */
export const SetupImageKey = z.string().regex(/^[0-9a-f]{64}$/, "a sha256: 64 lower-case hex digits");
export type SetupImageKey = z.infer<typeof SetupImageKey>;

/** A stored layer (local) or a manifest (registry), by content: `sha256:` and 64 hex. */
export const ImageDigest = z.string().regex(/^sha256:[0-9a-f]{64}$/, "sha256: and 64 lower-case hex digits");
export type ImageDigest = z.infer<typeof ImageDigest>;

/**
 * Everything that shapes what setup leaves behind (docs/image-cache.md has the table). Not in it,
 * on purpose: the run's id, its vault and routing, its model, cpus (speed only), the sandbox's
 * kind. The broker fills `format`, `backend` and `base`; the coordinator names the rest.
 */
export const SetupImageInputs = z.strictObject({
  format: z.number().int(),
  backend: z.enum(["sandbox0", "e2b", "local"]),
  /** The work image the layer sits on, by digest (local: buildah's image id as sha256:…). */
  base: z.string().min(1),
  /** The run's bundle (sha256 of its .tar.gz), unpacked before setup; null: none. */
  bundle: z.string().nullable(),
  /** The setup commands in order: the run's, then the task's own. */
  setup: z.array(z.string()).min(1),
  /** The limits setup ran under that change what it can do (not cpus: speed only). */
  resources: z.strictObject({ memoryMb: z.number().int(), pids: z.number().int() }),
});
export type SetupImageInputs = z.infer<typeof SetupImageInputs>;

/** JSON with object keys sorted at every level: one text per value, whatever built it. */
function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value && typeof value === "object") {
    const entries = Object.entries(value)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

/** The key of a setup (case P1): any change to an input misses, the same inputs hit. */
export async function setupImageKey(inputs: SetupImageInputs): Promise<SetupImageKey> {
  const bytes = new TextEncoder().encode(canonicalJson(SetupImageInputs.parse(inputs)));
  const hash = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(hash, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * `use` (the default): start from the environment's setup image when it has one for the key.
 * `rebuild`: run setup again and replace the stored image (this run's other sandboxes use it).
 */
export const SetupImageMode = z.enum(["use", "rebuild"]);
export type SetupImageMode = z.infer<typeof SetupImageMode>;

/**
 * What the broker tells a coordinator to do about one sandbox's setup (claimSetupImage):
 * - use: start from the built image (the broker names the digest at create; the coordinator
 *   never does, so no run can name another environment's image: case P3);
 * - build: run setup, seal, then capture (this sandbox holds the key's lease; claiming again
 *   renews it);
 * - wait: another sandbox is building it (this run's or another run's); claim again later;
 * - none: run setup as before and keep nothing (the backend cannot, the base is not pinned, the
 *   environment's bound is reached…), with the reason for the run's notes.
 */
export type SetupImageClaim =
  | { role: "use"; key: SetupImageKey; digest: ImageDigest; builtByRunId: string | null; builtAt: string }
  | { role: "build"; key: SetupImageKey }
  | { role: "wait"; key: SetupImageKey; builderRunId: string | null }
  | { role: "none"; reason: string };

/** What a capture kept: the digest the platform recorded, and its size. */
export const CapturedImage = z.strictObject({
  digest: ImageDigest,
  bytes: z.number().int().min(0),
  files: z.number().int().min(0),
});
export type CapturedImage = z.infer<typeof CapturedImage>;

/**
 * Paths a layer never keeps, relative to the sandbox's root (a trailing `/`: the directory and
 * everything under it): what belongs to one run (the wiring's files, its outputs, scratch space)
 * and what is the kernel's. Every seal-owned file is here (a unit test holds that). Case P4.
 */
export const LAYER_EXCLUDED: readonly string[] = [
  "etc/hosts",
  "etc/resolv.conf",
  "etc/nsswitch.conf",
  "etc/ssl/certs/ca-certificates.crt",
  "run/",
  "tmp/",
  "var/tmp/",
  "proc/",
  "dev/",
  "sys/",
  "home/sandbox/out/",
];

/**
 * bw-layer's exit codes (sandbox0's capture: a tar of the pod's working directory on stdout).
 * `refused`: something there the pod's uid cannot read, or a name a layer cannot carry;
 * `too_large`: past --max-bytes or --max-files. stderr says why.
 */
export const LAYER_EXIT = { ok: 0, failed: 1, refused: 2, tooLarge: 3 } as const;

/** An environment's setup image as the API lists it (GET /v1/setup-images). */
export const SetupImageItem = z
  .strictObject({
    key: SetupImageKey,
    status: z.enum(["building", "built", "dropping"]),
    digest: ImageDigest.nullable(),
    sizeBytes: z.number().int().nullable(),
    backend: z.enum(["sandbox0", "e2b", "local"]),
    /** The run that built it (null once that run is deleted, or while building). */
    builtBy: z.string().nullable(),
    builtAt: z.string().nullable(),
    lastUsedAt: z.string().nullable(),
    bundle: z.string().nullable(),
    setup: z.array(z.string()),
    resources: z.strictObject({ memoryMb: z.number().int(), pids: z.number().int() }),
  })
  .meta({ id: "SetupImage" });
export type SetupImageItem = z.infer<typeof SetupImageItem>;
