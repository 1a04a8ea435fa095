import { and, desc, eq, isNull, lte, ne, or, sql } from "drizzle-orm";
import { z } from "zod";
import type { Owner } from "../auth/owner";
import { setupImages } from "../db/schema";
import type { Db } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { openCursor, type Page, type PageRequest, pageOf } from "../lists/cursor";

// What the API shows and does with an environment's setup images: the list (newest use first)
// and a drop. Every query is bound to the caller's environment: another environment's key reads
// as unknown (case P3). Dropping only marks the row; the reaper removes the stored artifact and
// then the row (src/setup-images/reap.ts), so an answer never waits on a backend.

export type SetupImageRow = typeof setupImages.$inferSelect;

// Newest use first: the last start from it, else when it was built, else when its build began.
// Milliseconds, as a JS Date holds them, so the cursor's ISO time compares exactly.
const lastTouched = sql<Date>`date_trunc('milliseconds', coalesce(${setupImages.lastUsedAt}, ${setupImages.builtAt}, ${setupImages.createdAt}))`;
const CursorShape = z.tuple([z.iso.datetime(), z.string().min(1).max(64)]);

export async function listSetupImages(
  db: Db,
  p: Owner,
  page: PageRequest,
): Promise<Result<Page<SetupImageRow>>> {
  const at = await openCursor(page, "setup-images", p.environmentId, CursorShape);
  if (!at.ok) return at;
  const parsed = at.value;
  const rows = await db
    .select({ row: setupImages, touched: lastTouched.mapWith(setupImages.createdAt) })
    .from(setupImages)
    .where(
      and(
        eq(setupImages.environmentId, p.environmentId),
        parsed
          ? sql`(${lastTouched} < ${parsed[0]}::timestamptz or (${lastTouched} = ${parsed[0]}::timestamptz and ${setupImages.id} < ${parsed[1]}))`
          : undefined,
      ),
    )
    .orderBy(desc(lastTouched), desc(setupImages.id))
    .limit(page.limit + 1);
  const found = await pageOf(page, "setup-images", p.environmentId, rows, (r) => [
    r.touched.toISOString(),
    r.row.id,
  ]);
  return ok({ items: found.items.map(({ row }) => row), nextCursor: found.nextCursor });
}

/**
 * Marks the environment's setup image `key` for the reaper. Refused while a build (or a rebuild)
 * of it holds its lease: the build would write it back. Dropping one already going is a no-op.
 */
export async function dropSetupImage(db: Db, p: Owner, key: string, now = new Date()): Promise<Result<null>> {
  const mine = and(eq(setupImages.environmentId, p.environmentId), eq(setupImages.key, key));
  const marked = await db
    .update(setupImages)
    .set({ status: "dropping" })
    .where(
      and(
        mine,
        ne(setupImages.status, "building"),
        or(isNull(setupImages.leaseUntil), lte(setupImages.leaseUntil, now)),
      ),
    )
    .returning({ id: setupImages.id });
  if (marked.length > 0) return ok(null);
  const [held] = await db.select({ status: setupImages.status }).from(setupImages).where(mine);
  if (!held) return fail("not_found", `No setup image ${key} in this environment.`);
  return fail(
    "setup_image_building",
    `Setup image ${key} is being ${held.status === "building" ? "built" : "rebuilt"} by a run; drop it once that run's capture is done.`,
  );
}
