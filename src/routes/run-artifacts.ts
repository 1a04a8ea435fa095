import { CutReason } from "@benchwright/shared/contract/bundle";
import { createRoute, z } from "@hono/zod-openapi";
import { unwrap } from "../errors";
import { jsonOk, newRouter, problems } from "../router";
import { type ArtifactRow, artifactDownload, listArtifacts } from "../runs/artifacts";

// Results out: the files each work and task sandbox's commands left under $BW_OUT, collected when
// the commands ended, listed with what was cut (case H4), and downloadable one by one. Scoped to
// the caller's environment like every run route: another environment's run is a 404.

const Artifact = z
  .object({
    id: z.string(),
    sandboxId: z.string(),
    sandboxName: z.string().openapi({ description: '"work", or the task\'s name' }),
    path: z.string().openapi({ description: "Relative to $BW_OUT, `/`-separated" }),
    size: z.number().int(),
    sha256: z.string(),
  })
  .openapi("Artifact");

const CutArtifact = z
  .object({
    sandboxId: z.string(),
    sandboxName: z.string(),
    path: z.string(),
    reason: CutReason.clone().openapi({
      description:
        "too_large / too_many: past the size or count bound; symlink: never followed; special: not a regular file; unreadable",
    }),
    size: z.number().int().nullable().openapi({ description: "When it was known" }),
  })
  .openapi("CutArtifact");

const params = z.object({
  id: z
    .string()
    .max(64)
    .openapi({ param: { name: "id", in: "path" }, example: "run_0123456789abcdef" }),
});

const artifact = (a: ArtifactRow): z.infer<typeof Artifact> => ({
  id: a.id,
  sandboxId: a.sandboxId,
  sandboxName: a.sandboxName,
  path: a.path,
  size: a.size ?? 0,
  sha256: a.sha256 ?? "",
});

const tags = ["runs"];

export const runArtifactsRoutes = newRouter()
  .openapi(
    createRoute({
      method: "get",
      path: "/runs/{id}/artifacts",
      tags,
      operationId: "listRunArtifacts",
      summary: "The files the run's commands left in $BW_OUT, per sandbox, and what was cut",
      // No query parameters: one cannot widen the read (an unknown one is refused).
      request: { params, query: z.object({}).strict() },
      responses: {
        200: jsonOk(
          z.object({ artifacts: z.array(Artifact), cut: z.array(CutArtifact) }).openapi("RunArtifacts"),
        ),
        ...problems(401, 404),
      },
    }),
    async (c) => {
      const listed = unwrap(await listArtifacts(c.var.db, c.var.principal, c.req.valid("param").id));
      return c.json(
        {
          artifacts: listed.artifacts.map(artifact),
          cut: listed.cut.map((r) => ({
            sandboxId: r.sandboxId,
            sandboxName: r.sandboxName,
            path: r.path,
            reason: r.cutReason ?? "unreadable",
            size: r.size,
          })),
        },
        200,
      );
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/runs/{id}/artifacts/{artifactId}",
      tags,
      operationId: "downloadRunArtifact",
      summary: "One artifact's bytes (a download: application/octet-stream, as an attachment)",
      request: {
        params: params.extend({
          artifactId: z
            .string()
            .max(64)
            .openapi({ param: { name: "artifactId", in: "path" }, example: "art_0123456789abcdef" }),
        }),
        query: z.object({}).strict(),
      },
      responses: {
        200: {
          description: "The file as the run left it; its sha256 is in the listing",
          content: { "application/octet-stream": { schema: z.string().openapi({ format: "binary" }) } },
        },
        ...problems(401, 404),
      },
    }),
    async (c) => {
      const { id, artifactId } = c.req.valid("param");
      return unwrap(await artifactDownload(c.env.FILES, c.var.db, c.var.principal, id, artifactId));
    },
  );
