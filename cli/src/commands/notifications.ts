import type { Schemas } from "../api";
import { writeSecretFile } from "../io";
import {
  api,
  type Ctx,
  nextPage,
  type PageOptions,
  print,
  secretOf,
  secretTarget,
  table,
  withoutSecret,
} from "./shared";

// `benchwright notifications ...`: URLs told when a run of this environment ends (POST
// /v1/notifications), and what was sent to them. The signing secret is written to a file of the
// user's and never printed, like a webhook's.

type Notification = Schemas["Notification"];

function describe(n: Notification): string[] {
  return [`${n.id}  ${n.url}`, `events     ${n.events.join(", ")}`, `created    ${n.createdAt}`];
}

export async function notificationsCreate(
  ctx: Ctx,
  url: string,
  opts: { secretOut?: string },
): Promise<void> {
  const out = secretTarget(opts.secretOut);
  const made = await api(ctx).call("post", "/v1/notifications", { body: { url } });
  writeSecretFile(out, secretOf(made, "delete it and register the URL again"));
  print(ctx, withoutSecret(made, out), () => [
    ...describe(made),
    `signing secret written to ${out} (shown only this once; verify deliveries with it)`,
  ]);
}

export async function notificationsList(ctx: Ctx, page: PageOptions): Promise<void> {
  const res = await api(ctx).call("get", "/v1/notifications", { query: page });
  print(ctx, res, () => [
    ...(res.notifications.length === 0
      ? ["no notification URLs"]
      : table([["ID", "URL", "CREATED"], ...res.notifications.map((n) => [n.id, n.url, n.createdAt])])),
    ...nextPage(res.nextCursor),
  ]);
}

export async function notificationsDeliveries(ctx: Ctx, id: string, page: PageOptions): Promise<void> {
  const res = await api(ctx).call("get", "/v1/notifications/{id}/deliveries", {
    params: { id },
    query: page,
  });
  print(ctx, res, () => [
    ...(res.deliveries.length === 0
      ? ["nothing sent yet"]
      : table([
          ["DELIVERY", "RUN", "STATUS", "ATTEMPTS", "LAST"],
          ...res.deliveries.map((d) => {
            const last = d.attempts.at(-1);
            const said = last ? (last.error ?? `${last.statusCode}`) : "-";
            return [d.id, d.runId, d.status, String(d.attempts.length), said];
          }),
        ])),
    ...nextPage(res.nextCursor),
  ]);
}

export async function notificationsDelete(ctx: Ctx, id: string): Promise<void> {
  await api(ctx).call("delete", "/v1/notifications/{id}", { params: { id } });
  print(ctx, { id, deleted: true }, () => [`deleted ${id}: nothing more is sent to it`]);
}
