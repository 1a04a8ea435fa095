import { type SQL, sql } from "drizzle-orm";
import { vi } from "vitest";
import { type ApiResponse, withDb } from "./harness";

// Canary values and the spellings a leak of one could take (cases B5, C4). A canary is plain
// ASCII letters and digits, so its JSON, URL and header spellings are the value itself; the other
// spellings are the encodings a careless code path might apply before writing it somewhere. And
// the scan of the database's plaintext that the leak tests share.

/** A unique canary secret value: `cnry` + 32 random hex digits + a label. */
export function newCanary(label = "value"): string {
  return `cnry${crypto.randomUUID().replaceAll("-", "")}${label.replace(/[^A-Za-z0-9]/g, "")}`;
}

const utf8 = (text: string) => new TextEncoder().encode(text);
const hex = (bytes: Uint8Array) => [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
const base64 = (bytes: Uint8Array) => btoa(String.fromCharCode(...bytes));

/**
 * Every spelling of `value` a scan must not find: the value, its hex (both cases), and its base64
 * and base64url at all three byte alignments (inside e.g. `Basic base64(user:value)` the value
 * rarely starts on a 3-byte boundary, so only the characters that depend on it alone are kept),
 * and its unkeyed SHA-256 (a fingerprint must be keyed).
 */
export async function leakNeedles(value: string): Promise<string[]> {
  const bytes = utf8(value);
  const needles = new Set<string>([value, hex(bytes), hex(bytes).toUpperCase()]);
  for (let shift = 0; shift < 3; shift++) {
    const padded = new Uint8Array(shift + bytes.length);
    padded.set(bytes, shift);
    const encoded = base64(padded).replace(/=+$/, "");
    // Characters whose 6 bits all come from the value's bytes.
    const core = encoded.slice(Math.ceil((8 * shift) / 6), Math.floor((8 * padded.length) / 6));
    needles.add(core);
    needles.add(core.replaceAll("+", "-").replaceAll("/", "_"));
  }
  const sha = hex(new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)));
  needles.add(sha);
  needles.add(sha.slice(0, 16));
  return [...needles];
}

/** The needles found in `text`, each with where it was found. */
export function findNeedles(where: string, text: string, needles: readonly string[]): string[] {
  return needles.filter((n) => text.includes(n)).map((n) => `${where} contains ${JSON.stringify(n)}`);
}

/** A response as one text: status, every header and the body. */
export function responseText(res: ApiResponse): string {
  const headers = [...res.headers].map(([k, v]) => `${k}: ${v}`).join("\n");
  return `${res.status}\n${headers}\n\n${res.text}`;
}

export interface ColumnHit {
  where: string;
  needle: string;
}

const anyNeedle = (needles: readonly string[]) =>
  sql`unnest(array[${sql.join(
    needles.map((n) => sql`${n}`),
    sql`, `,
  )}]::text[]) as needle(v)`;

/**
 * Scans the database's plaintext for needles: every text/varchar/char/json/jsonb column of every
 * table outside the system schemas (information_schema tells which), and then every row of every
 * table as text, whatever its column types.
 */
export async function scanDatabase(needles: readonly string[]) {
  return withDb(async (db) => {
    const columns = (
      await db.execute(sql`
        select c.table_schema as schema, c.table_name as table, c.column_name as column
        from information_schema.columns c
        join information_schema.tables t on t.table_schema = c.table_schema and t.table_name = c.table_name
        where t.table_type = 'BASE TABLE'
          and c.table_schema not in ('pg_catalog', 'information_schema')
          and c.data_type in ('text', 'character varying', 'character', 'json', 'jsonb')
        order by 1, 2, 3`)
    ).rows as { schema: string; table: string; column: string }[];
    const hits: ColumnHit[] = [];
    const look = async (where: string, query: SQL) => {
      const found = (await db.execute(query)).rows as { v: string }[];
      for (const { v } of found) hits.push({ where, needle: v });
    };
    for (const { schema, table, column } of columns) {
      await look(
        `${schema}.${table}.${column}`,
        sql`select distinct needle.v from ${sql.identifier(schema)}.${sql.identifier(table)} as r, ${anyNeedle(needles)}
            where strpos(r.${sql.identifier(column)}::text, needle.v) > 0`,
      );
    }
    const tables = [...new Set(columns.map((c) => `${c.schema}\u0000${c.table}`))].map((k) =>
      k.split("\u0000"),
    );
    for (const [schema, table] of tables as [string, string][]) {
      await look(
        `${schema}.${table} (whole rows)`,
        sql`select distinct needle.v from ${sql.identifier(schema)}.${sql.identifier(table)} as r, ${anyNeedle(needles)}
            where strpos(r::text, needle.v) > 0`,
      );
    }
    return { columns: columns.map((c) => `${c.schema}.${c.table}.${c.column}`), hits };
  });
}

const LEVELS = ["log", "info", "warn", "error", "debug", "trace"] as const;

function show(value: unknown): string {
  if (typeof value === "string") return value;
  if (value instanceof Error) {
    const cause = value.cause === undefined ? "" : `\ncause: ${show(value.cause)}`;
    return `${value.name}: ${value.message}\n${value.stack ?? ""}${cause}`;
  }
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

/**
 * Captures everything logged in this isolate: under vitest-pool-workers the Worker runs in the
 * same isolate as the test, so these spies see the Worker's own console calls. Undo with
 * vi.restoreAllMocks().
 */
export function captureLogs(): string[] {
  const lines: string[] = [];
  for (const level of LEVELS) {
    vi.spyOn(console, level).mockImplementation((...args: unknown[]) => {
      lines.push(`${level}: ${args.map(show).join(" ")}`);
    });
  }
  return lines;
}

/** Bytes of one R2 object the walk reads at most (bundles inflated); past it the walk fails. */
const MAX_SCANNED_OBJECT = 64 * 1024 * 1024;

/**
 * Walks every object of the R2 bucket under `prefixes` (artifacts/ and bundles/ by default) and
 * looks for needles in its bytes: artifacts as stored, bundles inflated (a .tar.gz hides what it
 * holds from a scan of its compressed bytes). Case H5: the canary walk covers what runs store.
 */
export async function scanBucket(
  bucket: R2Bucket,
  needles: readonly string[],
  prefixes: readonly string[] = ["artifacts/", "bundles/"],
): Promise<{ keys: string[]; hits: ColumnHit[] }> {
  const keys: string[] = [];
  const hits: ColumnHit[] = [];
  for (const prefix of prefixes) {
    let cursor: string | undefined;
    do {
      const page = await bucket.list({ prefix, ...(cursor ? { cursor } : {}) });
      for (const o of page.objects) {
        keys.push(o.key);
        const object = await bucket.get(o.key);
        if (!object) continue;
        const body = o.key.startsWith("bundles/")
          ? object.body.pipeThrough(new DecompressionStream("gzip"))
          : object.body;
        const bytes = new Uint8Array(await new Response(body).arrayBuffer());
        if (bytes.length > MAX_SCANNED_OBJECT) throw new Error(`${o.key}: too large to scan`);
        // latin1: one character per byte, so an ASCII needle is found wherever its bytes are.
        const text = new TextDecoder("latin1").decode(bytes);
        for (const n of needles) if (text.includes(n)) hits.push({ where: `r2:${o.key}`, needle: n });
      }
      cursor = page.truncated ? page.cursor : undefined;
    } while (cursor);
  }
  return { keys, hits };
}
