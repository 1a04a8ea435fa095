import { api, type Ctx, nextPage, print, table } from "./shared";

// `benchwright logs ...`: what the boundary recorded, one page at a time (--limit, --cursor).

type Page = { limit?: number; cursor?: string };

/** One run's refused hosts, or with no run every host refused across the environment's runs. */
export async function blockedHosts(ctx: Ctx, id: string | undefined, page: Page): Promise<void> {
  const client = api(ctx);
  if (id === undefined) {
    const body = await client.call("get", "/v1/blocked-hosts", { query: page });
    print(ctx, body, () => [
      ...(body.blockedHosts.length === 0
        ? ["no hosts were refused"]
        : table([
            ["HOST", "COUNT", "RUNS", "SOURCE", "LAST SEEN"],
            ...body.blockedHosts.map((h) => [
              h.host,
              String(h.seenCount),
              String(h.runCount),
              h.source,
              h.lastSeen,
            ]),
          ])),
      ...nextPage(body.nextCursor),
    ]);
    return;
  }
  const body = await client.call("get", "/v1/runs/{id}/blocked-hosts", { params: { id }, query: page });
  print(ctx, body, () => [
    ...(body.blockedHosts.length === 0
      ? ["no hosts were refused"]
      : [
          ...table([
            ["HOST", "COUNT", "SOURCE", "LAST SEEN"],
            ...body.blockedHosts.map((h) => [h.host, String(h.seenCount), h.source, h.lastSeen]),
          ]),
          `allow them: benchwright vault hosts promote --run ${id}  (try it first: benchwright vault dry-run ${id} --allow HOST)`,
        ]),
    ...nextPage(body.nextCursor),
  ]);
}

export async function egressRoutes(ctx: Ctx, id: string, page: Page): Promise<void> {
  const body = await api(ctx).call("get", "/v1/runs/{id}/egress-routes", { params: { id }, query: page });
  print(ctx, body, () => [
    ...(body.egressRoutes.length === 0
      ? ["no traffic recorded"]
      : table([
          ["HOST", "ROUTE", "COUNT", "LAST SEEN"],
          ...body.egressRoutes.map((r) => [r.host, r.route, String(r.count), r.lastSeen]),
        ])),
    ...nextPage(body.nextCursor),
  ]);
}

/** Requests the run's proxy refused for a method or path limit (never the path). */
export async function limitRefusals(ctx: Ctx, id: string, page: Page): Promise<void> {
  const body = await api(ctx).call("get", "/v1/runs/{id}/limit-refusals", { params: { id }, query: page });
  print(ctx, body, () => [
    ...(body.limitRefusals.length === 0
      ? ["no request was refused by a method or path limit"]
      : table([
          ["HOST", "METHOD", "LIMIT", "COUNT", "LAST SEEN"],
          ...body.limitRefusals.map((r) => [r.host, r.method, r.limit, String(r.count), r.lastSeen]),
        ])),
    ...nextPage(body.nextCursor),
  ]);
}

/** Placeholders sent toward a host other than their rule's: out unswapped, never the secret. */
export async function strayPlaceholders(ctx: Ctx, id: string, page: Page): Promise<void> {
  const body = await api(ctx).call("get", "/v1/runs/{id}/stray-placeholders", {
    params: { id },
    query: page,
  });
  print(ctx, body, () => [
    ...(body.strayPlaceholders.length === 0
      ? ["no placeholder was sent to another host"]
      : [
          ...table([
            ["HOST", "SECRET", "COUNT", "LAST SEEN"],
            ...body.strayPlaceholders.map((r) => [r.host, r.secret, String(r.count), r.lastSeen]),
          ]),
          "these went out unswapped: those hosts saw only the placeholder, never the secret",
        ]),
    ...nextPage(body.nextCursor),
  ]);
}

export async function modelCalls(ctx: Ctx, id: string, page: Page): Promise<void> {
  const body = await api(ctx).call("get", "/v1/runs/{id}/model-calls", { params: { id }, query: page });
  const t = body.totals;
  const latency =
    t.latencyMs.p50 === null ? "" : `, latency p50 ${t.latencyMs.p50} ms, p95 ${t.latencyMs.p95} ms`;
  type Line = { used: number; limit: number | null };
  const spent = (line: Line, what: string) =>
    line.limit === null ? `${line.used} ${what} (no limit)` : `${line.used} / ${line.limit} ${what}`;
  const b = body.budget;
  const spend = b
    ? [
        `budget: ${spent(b.calls, "calls")}, ${spent(b.inputTokens, "input tokens")}, ${spent(b.outputTokens, "output tokens")}`,
      ]
    : [];
  print(ctx, body, () => [
    body.model
      ? `model ${body.model.name} (${body.model.provider}, ${body.model.baseHost})`
      : "the run declared no model",
    `${t.calls} calls (${t.refused} refused, ${t.errors} errors), ${t.inputTokens} tokens in (${t.cachedInputTokens} cached), ${t.outputTokens} out${latency}`,
    ...spend,
    ...(body.lastReportedAt ? [`as last reported by the run's proxy at ${body.lastReportedAt}`] : []),
    ...(body.calls.length === 0
      ? []
      : table([
          ["AT", "ENDPOINT", "STATUS", "IN", "OUT", "CACHED", "MS", "REFUSED"],
          ...body.calls.map((c) => [
            c.at,
            `${c.endpoint}${c.stream ? " (stream)" : ""}`,
            String(c.status),
            String(c.inputTokens),
            String(c.outputTokens),
            String(c.cachedInputTokens),
            String(c.ms),
            c.refused ?? "-",
          ]),
        ])),
    ...nextPage(body.nextCursor),
  ]);
}
