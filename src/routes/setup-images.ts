import { SetupImageItem, SetupImageKey } from "@benchwright/shared/contract/setup-image";
import { createRoute, z } from "@hono/zod-openapi";
import { unwrap } from "../errors";
import { iso, jsonOk, NextCursor, newRouter, PageQuery, problems } from "../router";
import { dropSetupImage, listSetupImages, type SetupImageRow } from "../setup-images/list";

// An environment's setup images (shared/contract/setup-image.ts): what its runs' setup left
// behind, kept per key so that later sandboxes with the same key skip setup. Only the platform
// builds them; here a caller can see them and drop one (the next run with that key builds it
// again). Another environment's key is 404, never told apart from an unknown one (case P3).

const view = (r: SetupImageRow): SetupImageItem => ({
  key: r.key,
  status: r.status,
  digest: r.digest,
  sizeBytes: r.sizeBytes,
  backend: r.backend,
  builtBy: r.builtByRunId,
  builtAt: iso(r.builtAt),
  lastUsedAt: iso(r.lastUsedAt),
  bundle: r.inputs.bundle,
  setup: r.inputs.setup,
  resources: r.inputs.resources,
});

const Query = PageQuery.strict();

const tags = ["setup images"];

export const setupImagesRoutes = newRouter()
  .openapi(
    createRoute({
      method: "get",
      path: "/setup-images",
      tags,
      operationId: "listSetupImages",
      summary: "This environment's setup images, most recently used first",
      description:
        "One per key: the sha256 of what shapes the setup's result (the work image, the bundle, the setup commands in order, memoryMb and pids). `building`: a run is making it; `built`: sandboxes with its key start from it and skip setup; `dropping`: asked to go, removed by the reaper.",
      request: { query: Query },
      responses: {
        200: jsonOk(z.object({ setupImages: z.array(SetupImageItem), nextCursor: NextCursor }).strict()),
        ...problems(400, 401),
      },
    }),
    async (c) => {
      const page = unwrap(
        await listSetupImages(c.var.db, c.var.principal, {
          ...c.req.valid("query"),
          ring: c.var.config.keyRing,
        }),
      );
      return c.json({ setupImages: page.items.map(view), nextCursor: page.nextCursor }, 200);
    },
  )
  .openapi(
    createRoute({
      method: "delete",
      path: "/setup-images/{key}",
      tags,
      operationId: "dropSetupImage",
      summary: "Drop a setup image: the next run with its key runs setup and builds it again",
      description:
        "Marks it `dropping` at once (no sandbox starts from it any more); the reaper then removes the stored layer or image and the record. 409 setup_image_building while a run is building or rebuilding it; another environment's key is 404 not_found, like an unknown one.",
      request: {
        params: z.object({
          // A clone: the contract's schema may predate @hono/zod-openapi's .openapi.
          key: SetupImageKey.clone().openapi({ param: { name: "key", in: "path" } }),
        }),
      },
      responses: { 204: { description: "Marked for dropping" }, ...problems(400, 401, 403, 404, 409) },
    }),
    async (c) => {
      unwrap(await dropSetupImage(c.var.db, c.var.principal, c.req.valid("param").key));
      return c.body(null, 204);
    },
  );
