import { type SQL, sql } from "drizzle-orm";
import type { AnyPgColumn } from "drizzle-orm/pg-core";
import { z } from "zod";

// The cursor key of a list newest first by (createdAt, id): createdAt is written by Postgres
// (microseconds), and a JS Date keeps milliseconds, so the key holds its epoch microseconds as
// text; a millisecond key could skip rows made within one millisecond.

export const EpochMicros = z.string().regex(/^\d{1,20}$/);
export const RowId = z.string().min(1).max(64);
export const CreatedKey = z.tuple([EpochMicros, RowId]);
export type CreatedKey = z.infer<typeof CreatedKey>;

/** A row's createdAt as epoch microseconds (text): select it to make the next cursor's key. */
export const createdMicros = (createdAt: AnyPgColumn) =>
  sql<string>`(extract(epoch from ${createdAt}) * 1000000)::bigint::text`;

/** Rows after `key` in (createdAt, id) descending order; undefined (no condition) on page one. */
export const olderThan = (
  createdAt: AnyPgColumn,
  id: AnyPgColumn,
  key: CreatedKey | null,
): SQL | undefined =>
  key ? sql`(${createdMicros(createdAt)}::bigint, ${id}) < (${key[0]}::bigint, ${key[1]})` : undefined;
