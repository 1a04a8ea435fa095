import { readFileSync } from "node:fs";
import { dropTrailingNewline, readAll } from "../io";
import { api, type Ctx, nextPage, print, table, UsageError } from "./shared";

// `benchwright bug-reports ...`: report a bug on one of your runs (it joins the run's trace), and
// read a run's reports.

async function bodyOf(opts: { body?: string; bodyFile?: string }): Promise<string> {
  if (opts.body !== undefined && opts.bodyFile !== undefined)
    throw new UsageError("--body or --body-file, not both");
  if (opts.body !== undefined) return opts.body;
  if (opts.bodyFile !== undefined) {
    try {
      return readFileSync(opts.bodyFile, "utf8");
    } catch (error) {
      throw new UsageError(`cannot read ${opts.bodyFile}: ${(error as NodeJS.ErrnoException).code ?? error}`);
    }
  }
  if (process.stdin.isTTY) throw new UsageError("give --body TEXT or --body-file PATH, or pipe the body in");
  return dropTrailingNewline(await readAll(process.stdin));
}

export async function bugReportsCreate(
  ctx: Ctx,
  runId: string,
  opts: { title?: string; body?: string; bodyFile?: string },
): Promise<void> {
  if (!opts.title) throw new UsageError("--title is required");
  const body = await bodyOf(opts);
  const made = await api(ctx).call("post", "/v1/bug-reports", { body: { runId, title: opts.title, body } });
  print(ctx, made, () => [`filed ${made.id} on ${made.runId}: ${made.title}`]);
}

export async function bugReportsList(
  ctx: Ctx,
  runId: string,
  pageOpts: { limit?: number | undefined; cursor?: string | undefined },
): Promise<void> {
  const res = await api(ctx).call("get", "/v1/runs/{id}/bug-reports", {
    params: { id: runId },
    query: { limit: pageOpts.limit, cursor: pageOpts.cursor },
  });
  print(ctx, res, () => [
    ...(res.bugReports.length === 0
      ? ["no bug reports"]
      : table([["ID", "CREATED", "TITLE"], ...res.bugReports.map((r) => [r.id, r.createdAt, r.title])])),
    ...nextPage(res.nextCursor),
  ]);
}
