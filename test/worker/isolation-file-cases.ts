import { eq } from "drizzle-orm";
import { expect } from "vitest";
import { bundles, setupImages } from "../../src/db/schema";
import { file, tarGz, upload } from "./archives";
import { call, expectProblem, withDb } from "./harness";
import { type Case, expectNoWidening, expectStatus, ownRunOnly, type Vault } from "./isolation-fixtures";

// The isolation cases of stored files: a run's artifacts (the list and one download), bundles
// (an upload, a read by hash; case H3) and setup images (the list, a drop; case P3): one per operation, merged into the table of the whole
// document in isolation-cases.ts; isolation-files.test.ts runs them. Apart from the other run
// routes because what they guard is the content of files, not only rows.

/** A tenant's bundle rows. */
async function bundleRows(v: Vault) {
  return withDb((db) =>
    db.select().from(bundles).where(eq(bundles.environmentId, v.t.environmentId)).orderBy(bundles.sha256),
  );
}

/** A tenant's setup image rows. */
async function setupImageRows(v: Vault) {
  return withDb((db) =>
    db
      .select()
      .from(setupImages)
      .where(eq(setupImages.environmentId, v.t.environmentId))
      .orderBy(setupImages.id),
  );
}

export const FILE_CASES: Record<string, Case> = {
  "GET /v1/runs/{id}/artifacts": {
    kind: "run",
    id: true,
    check: async (ctx, method, path) => {
      const { a } = ctx;
      const own = await ownRunOnly(ctx, method, path, "list");
      expect(own.json.artifacts.map((x: { path: string }) => x.path)).toEqual([`${a.tag}.json`]);
      expect(own.json.cut.map((x: { path: string }) => x.path)).toEqual([`${a.tag}-link`]);
      await expectNoWidening(ctx, method, path);
    },
  },
  "GET /v1/runs/{id}/artifacts/{artifactId}": {
    kind: "run",
    id: true,
    check: async ({ a, b }, method, path) => {
      const at = (runId: string, artifactId: string) =>
        path.replace("{id}", runId).replace("{artifactId}", artifactId);
      // B's artifact under B's run, under A's own run; A's artifact under B's run: all 404.
      for (const [runId, artifactId] of [
        [b.runId, b.artifactId],
        [a.runId, b.artifactId],
        [b.runId, a.artifactId],
      ] as const) {
        const res = expectProblem(await a.t.api(method, at(runId, artifactId)), 404, "not_found");
        expect(res.text).not.toContain(b.tag);
      }
      const own = expectStatus(await a.t.api(method, at(a.runId, a.artifactId)), 200, "download");
      expect(own.text).toBe(`{"result":"${a.tag}"}`);
    },
  },
  "POST /v1/bundles": {
    kind: "bundle",
    id: false,
    check: async ({ a, b }) => {
      // A's upload is A's: B cannot read it or launch with it; B's bundles are unchanged.
      const bBefore = await bundleRows(b);
      const made = await upload(a.t.key, await tarGz([file("new.txt", `new in ${a.tag}`)]));
      expectStatus(made, 201, "upload");
      expectStatus(await a.t.api("GET", `/v1/bundles/${made.json.sha256}`), 200, "A reads its own");
      expectProblem(await b.t.api("GET", `/v1/bundles/${made.json.sha256}`), 404, "bundle_not_found");
      expectProblem(
        await b.t.api("POST", "/v1/runs", { commands: ["ls"], bundle: made.json.sha256 }),
        404,
        "bundle_not_found",
      );
      expect(await bundleRows(b)).toEqual(bBefore);
    },
  },
  "GET /v1/bundles/{sha256}": {
    kind: "bundle",
    id: true,
    check: async ({ a, b }, method, path) => {
      const res = expectProblem(
        await a.t.api(method, path.replace("{sha256}", b.bundle)),
        404,
        "bundle_not_found",
      );
      expect(res.text).not.toContain(b.t.environmentId);
      const own = expectStatus(await a.t.api(method, path.replace("{sha256}", a.bundle)), 200, "read");
      expect(own.json.sha256).toBe(a.bundle);
    },
  },
  "GET /v1/setup-images": {
    kind: "setupImage",
    id: false,
    check: async ({ a, b }, method, path) => {
      const res = expectStatus(await a.t.api(method, path), 200, "list");
      expect(res.json.setupImages.map((i: { key: string }) => i.key)).toEqual([a.setupImage]);
      expect(res.text).not.toContain(b.setupImage);
      expect(res.text).not.toContain(b.tag);
      expect(res.text).not.toContain(b.runId);
      // A query naming B's environment cannot widen it.
      expectProblem(
        await a.t.api(method, `${path}?environmentId=${b.t.environmentId}`),
        400,
        "unknown_field",
      );
    },
  },
  "DELETE /v1/setup-images/{key}": {
    kind: "setupImage",
    id: true,
    check: async ({ a, b }, method, path) => {
      const bBefore = await setupImageRows(b);
      const theirs = expectProblem(
        await a.t.api(method, path.replace("{key}", b.setupImage)),
        404,
        "not_found",
      );
      expect(theirs.text).not.toContain(b.t.environmentId);
      expect(await setupImageRows(b)).toEqual(bBefore);
      // A read key of A's may list them but not drop one.
      const read = expectStatus(
        await a.t.api("POST", "/v1/api-keys", { name: "read", scope: "read" }),
        201,
        "read key",
      ).json.key as string;
      const own = path.replace("{key}", a.setupImage);
      expectProblem(await call(read, method, own), 403, "read_only_key");
      expect((await setupImageRows(a)).map((r) => r.status)).toEqual(["built"]);
      expectStatus(await a.t.api(method, own), 204, "drop own");
      expect((await setupImageRows(a)).map((r) => r.status)).toEqual(["dropping"]);
    },
  },
};
