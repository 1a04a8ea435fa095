import { BundleHash } from "@benchwright/shared/contract/bundle";
import { createRoute, z } from "@hono/zod-openapi";
import { type BundleRow, findBundle, readUpload, storeBundle } from "../bundles/service";
import { ApiError } from "../errors";
import { jsonOk, newRouter, problems } from "../router";

// Benchmark code in: a bundle is a .tar.gz of the benchmark's folder, uploaded once and named by
// its sha256 in run specs (`bundle`). The upload is checked entry by entry (shared/archive) before
// it is stored: path traversal, absolute paths, links out of the tree, device files and
// decompression bombs are each refused with their own code (cases H1, H2). Bundles are per
// environment: another environment's hash is 404 (case H3).

const Bundle = z
  .object({
    sha256: z
      .string()
      .openapi({ description: "The bundle's name: the sha256 of the .tar.gz, 64 hex digits" }),
    size: z.number().int().openapi({ description: "Bytes of the .tar.gz" }),
    files: z.number().int().openapi({ description: "Files, directories and links it unpacks to" }),
    unpackedBytes: z.number().int().openapi({ description: "The sum of its files' sizes, unpacked" }),
    createdAt: z.string().datetime(),
  })
  .openapi("Bundle");

const view = (b: BundleRow): z.infer<typeof Bundle> => ({
  sha256: b.sha256,
  size: b.size,
  files: b.files,
  unpackedBytes: b.unpackedBytes,
  createdAt: b.createdAt.toISOString(),
});

/** The media types an upload may be sent as. */
export const BUNDLE_MEDIA_TYPES = ["application/gzip", "application/x-gzip", "application/octet-stream"];

const binary = z.string().openapi({ format: "binary", description: "The .tar.gz itself" });

const tags = ["bundles"];

export const bundlesRoutes = newRouter()
  .openapi(
    createRoute({
      method: "post",
      path: "/bundles",
      tags,
      operationId: "uploadBundle",
      summary:
        "Upload a bundle (the benchmark's folder as a .tar.gz); checked entry by entry, stored by its sha256",
      description:
        "At most BUNDLE_MAX_BYTES (64 MiB by default) → 413 bundle_upload_too_large. A refused bundle is 422 with the reason as `code` (bundle_path_traversal, bundle_absolute_path, bundle_link_escape, bundle_special_file, bundle_too_large, bundle_too_many_files, bundle_invalid).",
      request: {
        body: {
          required: true,
          content: {
            "application/gzip": { schema: binary },
            "application/octet-stream": { schema: binary },
          },
        },
      },
      responses: {
        201: jsonOk(Bundle, "Stored"),
        200: jsonOk(Bundle, "Already stored in this environment (the same bytes)"),
        ...problems(401, 413, 415, 422),
      },
    }),
    async (c) => {
      const type = (c.req.header("content-type") ?? "").split(";")[0]?.trim().toLowerCase() ?? "";
      if (!BUNDLE_MEDIA_TYPES.includes(type)) {
        await c.req.raw.body?.cancel().catch(() => {});
        throw new ApiError(
          "unsupported_media_type",
          `Send the .tar.gz as application/gzip or application/octet-stream, not ${JSON.stringify(type || "nothing")}.`,
        );
      }
      const length = c.req.header("content-length");
      const declared = length !== undefined && /^\d{1,15}$/.test(length) ? Number(length) : null;
      const limits = c.var.config.bundleLimits;
      const chunks = await readUpload(c.req.raw.body, declared, limits.maxUploadBytes);
      const { bundle, created } = await storeBundle(
        c.env.FILES,
        c.var.db,
        c.var.principal.environmentId,
        chunks,
        limits,
      );
      return c.json(view(bundle), created ? 201 : 200);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/bundles/{sha256}",
      tags,
      operationId: "getBundle",
      summary: "Read a bundle's metadata (another environment's hash is 404)",
      request: {
        params: z.object({
          // A clone: the contract's schema may predate @hono/zod-openapi's .openapi.
          sha256: BundleHash.clone().openapi({
            param: { name: "sha256", in: "path" },
          }),
        }),
      },
      responses: { 200: jsonOk(Bundle), ...problems(400, 401, 404) },
    }),
    async (c) => {
      const { sha256 } = c.req.valid("param");
      const bundle = await findBundle(c.var.db, c.var.principal.environmentId, sha256);
      if (!bundle) throw new ApiError("bundle_not_found", `No bundle ${sha256} in this environment.`);
      return c.json(view(bundle), 200);
    },
  );
