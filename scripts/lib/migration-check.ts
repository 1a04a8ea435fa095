import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { MIGRATIONS } from "./migrate";
import { nodeDb } from "./neon-node";

// Do the migrations in a database and in this checkout agree? drizzle's migrator records each
// migration it applied as (sha256 of its file, the journal's `when`) and applies only files newer
// than the newest record: it never notices a database ahead of the code, an applied file edited
// since, or an older file it never ran. A deploy must refuse all three before it migrates, since
// the code it is about to ship would meet a schema it was not written for.

export interface CodeMigration {
  /** The file's name without .sql, e.g. 0003_linger. */
  readonly tag: string;
  readonly hash: string;
  readonly createdAt: number;
}

export interface AppliedMigration {
  readonly hash: string;
  readonly createdAt: number;
}

export type MigrationAgreement =
  | { readonly ok: true; readonly pending: readonly string[] }
  | { readonly ok: false; readonly problems: readonly string[] };

const Journal = (folder: string) =>
  JSON.parse(readFileSync(join(folder, "meta", "_journal.json"), "utf8")) as {
    entries: { tag: string; when: number }[];
  };

/** The committed migrations, hashed as drizzle's migrator hashes them. */
export function codeMigrations(folder = MIGRATIONS): CodeMigration[] {
  return Journal(folder).entries.map((e) => ({
    tag: e.tag,
    hash: createHash("sha256")
      .update(readFileSync(join(folder, `${e.tag}.sql`), "utf8"))
      .digest("hex"),
    createdAt: e.when,
  }));
}

/** What drizzle recorded in the database; none for a database never migrated. */
export async function appliedMigrations(databaseUrl: string): Promise<AppliedMigration[]> {
  const { pool } = nodeDb(databaseUrl);
  try {
    const table = await pool.query("select to_regclass('drizzle.__drizzle_migrations')::text as t");
    if (!table.rows[0]?.t) return [];
    const rows = await pool.query<{ hash: string; created_at: string }>(
      "select hash, created_at::text from drizzle.__drizzle_migrations order by created_at",
    );
    return rows.rows.map((r) => ({ hash: r.hash, createdAt: Number(r.created_at) }));
  } finally {
    await pool.end();
  }
}

const when = (ms: number) => new Date(ms).toISOString();

export function compareMigrations(
  code: readonly CodeMigration[],
  applied: readonly AppliedMigration[],
): MigrationAgreement {
  const byTime = new Map(code.map((m) => [m.createdAt, m]));
  const newestCode = Math.max(0, ...code.map((m) => m.createdAt));
  const newestApplied = Math.max(0, ...applied.map((m) => m.createdAt));
  const problems: string[] = [];
  for (const row of applied) {
    const mine = byTime.get(row.createdAt);
    if (!mine) {
      problems.push(
        row.createdAt > newestCode
          ? `the database has a migration newer than this checkout (made ${when(row.createdAt)}): deploy the code that made it, or newer`
          : `the database has a migration this checkout does not have (made ${when(row.createdAt)})`,
      );
    } else if (mine.hash !== row.hash) {
      problems.push(`migrations/${mine.tag}.sql was changed after the database applied it`);
    }
  }
  const applies = new Set(applied.map((m) => m.createdAt));
  for (const m of code) {
    if (!applies.has(m.createdAt) && m.createdAt <= newestApplied) {
      problems.push(
        `migrations/${m.tag}.sql is older than the database's newest migration and was never applied (the migrator would skip it)`,
      );
    }
  }
  if (problems.length > 0) return { ok: false, problems };
  return { ok: true, pending: code.filter((m) => m.createdAt > newestApplied).map((m) => m.tag) };
}
