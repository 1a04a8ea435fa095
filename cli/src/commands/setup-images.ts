import { size } from "./bundles";
import { api, type Ctx, nextPage, print, table } from "./shared";

// `benchwright setup-images ...`: the setup images this environment keeps (GET /v1/setup-images):
// a run's setup kept once and started from by later sandboxes with the same key, and DELETE to
// drop one (the next run with that setup builds it again).

export async function setupImagesList(
  ctx: Ctx,
  pageOpts: { limit?: number | undefined; cursor?: string | undefined },
): Promise<void> {
  const res = await api(ctx).call("get", "/v1/setup-images", {
    query: { limit: pageOpts.limit, cursor: pageOpts.cursor },
  });
  print(ctx, res, () => [
    ...(res.setupImages.length === 0
      ? ["no setup images"]
      : table([
          ["KEY", "STATUS", "SIZE", "BUILT BY", "LAST USED", "SETUP"],
          ...res.setupImages.map((i) => [
            i.key.slice(0, 12),
            i.status,
            i.sizeBytes === null ? "-" : size(i.sizeBytes),
            i.builtBy ?? "-",
            i.lastUsedAt ?? "-",
            i.setup.join(" && ").slice(0, 60),
          ]),
        ])),
    ...nextPage(res.nextCursor),
  ]);
}

export async function setupImagesDelete(ctx: Ctx, key: string): Promise<void> {
  await api(ctx).call("delete", "/v1/setup-images/{key}", { params: { key } });
  print(ctx, { key, dropping: true }, () => [
    `dropping setup image ${key}: no sandbox starts from it now; the next run with this setup builds it again`,
  ]);
}
