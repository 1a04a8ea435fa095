import { consoleLog } from "@benchwright/shared/contract/log";
import { and, eq } from "drizzle-orm";
import { z } from "zod";
import type { Capability } from "../compute/capability";
import { randomId } from "../crypto/api-keys";
import { imageBuilds } from "../db/schema";
import type { Db } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { PATH_COMPONENT, type RegistrySettings } from "./config";
import { MANIFEST_MEDIA_TYPES, type RegistryClient } from "./registry";
import { mintRegistryToken } from "./token";

// The image build cache (docs/image-cache.md). One registry repository per (environment, content
// hash), `<prefix>/<environmentId>/<hash>`, tagged with the hash: registry tokens are scoped per
// repository, so a push token for that repository can write that one cache entry and nothing
// else. The broker records the digest the tag held when the pushing run confirmed its push, and
// vouches for the entry only while the tag still holds that digest; what it hands out is the
// image by digest, so a later push to the tag cannot change what a run executes.

export const ContentHash = z
  .string()
  .regex(/^[0-9a-f]{64}$/, "must be 64 lowercase hex digits (the recipe's SHA-256)");

/** How long a push token is valid: one image build and push, not a standing credential. */
export const PUSH_TOKEN_TTL_SECONDS = 10 * 60;

export interface BuiltImage {
  status: "built";
  contentHash: string;
  /** `<registry>/<repository>@<digest>`: what to run. */
  image: string;
  digest: string;
  repository: string;
  tag: string;
  builtAt: string;
}

/**
 * Why this answer is a push: `new` (no entry), `pending` (a push was handed out and never
 * confirmed), `tag_changed` / `tag_missing` (the entry was built, but the tag no longer holds the
 * recorded digest, so the broker no longer vouches for it and a rebuild is asked for).
 */
export type PushReason = "new" | "pending" | "tag_changed" | "tag_missing";

export interface PushGrant {
  status: "push";
  reason: PushReason;
  contentHash: string;
  /** host[:port] of the registry, as image references and `docker login` spell it. */
  registry: string;
  repository: string;
  tag: string;
  /** `<registry>/<repository>:<tag>`: where to push. */
  image: string;
  /** A registry bearer token for push and pull on `repository` only. Shown once, never stored. */
  token: string;
  expiresAt: string;
}

export type ImageAnswer = BuiltImage | PushGrant;

export interface Registry {
  settings: RegistrySettings;
  client: RegistryClient;
}

type Row = typeof imageBuilds.$inferSelect;

const NO_PUSH = "No image push of this run is pending for that content hash.";

export function repositoryFor(prefix: string, environmentId: string, contentHash: string): string {
  // Environment ids are random lowercase base32 after `env_`: already a valid path component.
  if (!PATH_COMPONENT.test(environmentId)) throw new Error("environment id is not a repository component");
  return `${prefix}/${environmentId}/${contentHash}`;
}

async function findRow(db: Db, environmentId: string, contentHash: string): Promise<Row | undefined> {
  const [row] = await db
    .select()
    .from(imageBuilds)
    .where(and(eq(imageBuilds.environmentId, environmentId), eq(imageBuilds.contentHash, contentHash)));
  return row;
}

const builtAnswer = (registry: Registry, row: Row, digest: string): BuiltImage => ({
  status: "built",
  contentHash: row.contentHash,
  image: `${registry.settings.host}/${row.repository}@${digest}`,
  digest,
  repository: row.repository,
  tag: row.tag,
  builtAt: (row.builtAt ?? new Date()).toISOString(),
});

/**
 * POST /compute/images: the cached image for the run's environment and `contentHash` if the
 * registry still holds what was recorded, else a push credential for the calling run.
 */
export async function requestImage(
  db: Db,
  registry: Registry,
  cap: Capability,
  contentHash: string,
  now = new Date(),
): Promise<Result<ImageAnswer>> {
  // Two rounds at most: a concurrent request may flip the row between our read and our write.
  for (let attempt = 0; attempt < 2; attempt++) {
    const row = await findRow(db, cap.run.environmentId, contentHash);
    if (row?.status === "built" && row.digest) {
      const seen = await registry.client.manifest(row.repository, row.tag);
      if (!seen.ok) return seen;
      if (seen.value.found && seen.value.digest === row.digest)
        return ok(builtAnswer(registry, row, row.digest));
      const reason: PushReason = seen.value.found ? "tag_changed" : "tag_missing";
      consoleLog("warn", {
        event: "image_tag_changed",
        environmentId: row.environmentId,
        repository: row.repository,
        recordedDigest: row.digest,
        seenDigest: seen.value.found ? seen.value.digest : null,
      });
      const grant = await mintPush(registry, cap, row.repository, now);
      // Back to pending only if nobody changed the row since we read it.
      const [reset] = await db
        .update(imageBuilds)
        .set({
          status: "pending",
          digest: null,
          builtAt: null,
          pushRunId: cap.run.id,
          pushExpiresAt: grant.expiresAt,
        })
        .where(
          and(
            eq(imageBuilds.id, row.id),
            eq(imageBuilds.status, "built"),
            eq(imageBuilds.digest, row.digest),
          ),
        )
        .returning({ id: imageBuilds.id });
      if (reset) return ok(issued(registry, cap, row.repository, row.tag, contentHash, reason, grant));
      continue;
    }
    const repository =
      row?.repository ?? repositoryFor(registry.settings.prefix, cap.run.environmentId, contentHash);
    const tag = row?.tag ?? contentHash;
    const grant = await mintPush(registry, cap, repository, now);
    // Insert, or take over a pending entry; a built one (confirmed meanwhile) is left alone.
    const [pending] = await db
      .insert(imageBuilds)
      .values({
        id: randomId("img_"),
        environmentId: cap.run.environmentId,
        contentHash,
        repository,
        tag,
        status: "pending",
        pushRunId: cap.run.id,
        pushExpiresAt: grant.expiresAt,
      })
      .onConflictDoUpdate({
        target: [imageBuilds.environmentId, imageBuilds.contentHash],
        set: { pushRunId: cap.run.id, pushExpiresAt: grant.expiresAt },
        setWhere: eq(imageBuilds.status, "pending"),
      })
      .returning({ id: imageBuilds.id });
    if (pending) {
      return ok(issued(registry, cap, repository, tag, contentHash, row ? "pending" : "new", grant));
    }
  }
  return fail("internal_error", "The image cache entry kept changing; retry.");
}

interface MintedPush {
  token: string;
  jti: string;
  expiresAt: Date;
}

function mintPush(registry: Registry, cap: Capability, repository: string, now: Date): Promise<MintedPush> {
  const { settings } = registry;
  return mintRegistryToken(
    settings.signingKey,
    {
      issuer: settings.issuer,
      service: settings.service,
      // The registry logs it as the user: which run pushed.
      subject: `run:${cap.run.id}`,
      // Exactly one repository; pull too, as registries require it for blob uploads and mounts.
      access: [{ type: "repository", name: repository, actions: ["push", "pull"] }],
      ttlSeconds: PUSH_TOKEN_TTL_SECONDS,
    },
    now,
  );
}

function issued(
  registry: Registry,
  cap: Capability,
  repository: string,
  tag: string,
  contentHash: string,
  reason: PushReason,
  grant: MintedPush,
): PushGrant {
  // The token's id, never the token: enough to match the registry's own log of its use.
  consoleLog("info", {
    event: "image_push_issued",
    runId: cap.run.id,
    environmentId: cap.run.environmentId,
    repository,
    tag,
    reason,
    jti: grant.jti,
    expiresAt: grant.expiresAt.toISOString(),
  });
  return {
    status: "push",
    reason,
    contentHash,
    registry: registry.settings.host,
    repository,
    tag,
    image: `${registry.settings.host}/${repository}:${tag}`,
    token: grant.token,
    expiresAt: grant.expiresAt.toISOString(),
  };
}

/**
 * POST /compute/images/{hash}/pushed: the run that holds the pending push says it pushed. The
 * broker reads the tag's digest from the registry and records it; the pusher's word is only the
 * trigger. Idempotent for that run while the tag still holds the recorded digest.
 */
export async function confirmPush(
  db: Db,
  registry: Registry,
  cap: Capability,
  contentHash: string,
  now = new Date(),
): Promise<Result<BuiltImage>> {
  const row = await findRow(db, cap.run.environmentId, contentHash);
  // Another run's push (or none) is not this run's to confirm: 404 as for no entry at all.
  if (!row || row.pushRunId !== cap.run.id) return fail("not_found", NO_PUSH);
  const seen = await registry.client.manifest(row.repository, row.tag);
  if (!seen.ok) return seen;
  if (!seen.value.found) {
    return fail(
      "image_not_pushed",
      `${registry.settings.host}/${row.repository}:${row.tag} has no manifest yet.`,
    );
  }
  const { digest, mediaType } = seen.value;
  if (!(MANIFEST_MEDIA_TYPES as readonly string[]).includes(mediaType)) {
    return fail(
      "image_not_pushed",
      `The tag holds a ${JSON.stringify(mediaType)} manifest, not an OCI or Docker v2 image or index.`,
    );
  }
  if (row.status === "built") {
    if (row.digest === digest) return ok(builtAnswer(registry, row, digest));
    return fail(
      "image_tag_changed",
      `The tag was pushed again after the build was recorded (${row.digest}); ask POST /compute/images again.`,
    );
  }
  const [built] = await db
    .update(imageBuilds)
    .set({ status: "built", digest, builtAt: now })
    .where(
      and(
        eq(imageBuilds.id, row.id),
        eq(imageBuilds.status, "pending"),
        eq(imageBuilds.pushRunId, cap.run.id),
      ),
    )
    .returning();
  if (!built) {
    // Taken over by another run, or confirmed by a concurrent call of this run: answer as for it.
    const latest = await findRow(db, cap.run.environmentId, contentHash);
    if (latest?.status === "built" && latest.pushRunId === cap.run.id && latest.digest === digest) {
      return ok(builtAnswer(registry, latest, digest));
    }
    return fail("not_found", NO_PUSH);
  }
  consoleLog("info", {
    event: "image_built",
    runId: cap.run.id,
    environmentId: built.environmentId,
    repository: built.repository,
    tag: built.tag,
    digest,
  });
  return ok(builtAnswer(registry, built, digest));
}
