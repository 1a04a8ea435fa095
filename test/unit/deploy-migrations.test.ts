import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { applyMigrations } from "../../scripts/lib/migrate";
import { codeMigrations, compareMigrations } from "../../scripts/lib/migration-check";
import { configureNeonForNode, nodeDb } from "../../scripts/lib/neon-node";
import { findPostgresBin, type LocalPostgres, startPostgresql } from "../../scripts/lib/postgres";
import { startWsBridge, type WsBridge } from "../../scripts/lib/ws-bridge";

// `npm run deploy` (scripts/deploy.ts) against a real Postgres through the real Neon driver: it
// refuses while the database's migrations and the checkout's disagree, before it migrates or
// runs wrangler, and never prints the database URL. Its --dry-run builds the Worker with
// `wrangler deploy --dry-run` and changes nothing.

const code = codeMigrations();
/** The checkout's migration at i (negative: from the end). */
function nth(i: number) {
  const m = code.at(i);
  if (!m) throw new Error(`the checkout has no migration ${i}`);
  return m;
}
const at = (i: number) => ({ hash: nth(i).hash, createdAt: nth(i).createdAt });

describe("compareMigrations", () => {
  it("a database behind the checkout: the newer files are pending, in order", () => {
    const r = compareMigrations(code, [at(0), at(1)]);
    expect(r).toEqual({ ok: true, pending: code.slice(2).map((m) => m.tag) });
  });

  it("a database at the checkout: nothing pending", () => {
    expect(
      compareMigrations(
        code,
        code.map((_, i) => at(i)),
      ),
    ).toEqual({ ok: true, pending: [] });
  });

  it("a database never migrated: everything pending", () => {
    expect(compareMigrations(code, [])).toEqual({ ok: true, pending: code.map((m) => m.tag) });
  });

  it("a file edited after it was applied is named", () => {
    const r = compareMigrations(code, [at(0), { ...at(1), hash: "0".repeat(64) }]);
    expect(r).toEqual({
      ok: false,
      problems: [`migrations/${nth(1).tag}.sql was changed after the database applied it`],
    });
  });

  it("a database ahead of the checkout is refused", () => {
    const newer = { hash: "f".repeat(64), createdAt: nth(-1).createdAt + 1000 };
    const r = compareMigrations(code, [...code.map((_, i) => at(i)), newer]);
    expect(r.ok).toBe(false);
    expect(!r.ok && r.problems[0]).toMatch(/^the database has a migration newer than this checkout/);
  });

  it("an older file the migrator would skip is refused", () => {
    const r = compareMigrations(code, [at(0), at(2)]);
    expect(r).toEqual({
      ok: false,
      problems: [
        expect.stringMatching(new RegExp(`^migrations/${nth(1).tag}\\.sql is older .* never applied`)),
      ],
    });
  });
});

const bin = findPostgresBin();

// Each run of the script loads wrangler (seconds on a busy machine), a dry run builds the Worker.
describe.skipIf(!bin)("npm run deploy against a real database", { timeout: 300_000 }, () => {
  let pg: LocalPostgres;
  let bridge: WsBridge;
  let work: string;
  let freshUrl: string;

  beforeAll(async () => {
    pg = await startPostgresql(bin as string, { signIn: "password" });
    bridge = await startWsBridge({ host: pg.host, port: pg.port });
    configureNeonForNode(bridge.address);
    await applyMigrations(pg.url);
    const { pool } = nodeDb(pg.url);
    await pool.query("create database fresh");
    await pool.end();
    freshUrl = pg.url.replace(/\/[^/]+$/, "/fresh");
    work = mkdtempSync(join(tmpdir(), "bw-deploy-"));
  }, 120_000);

  afterAll(async () => {
    await bridge?.close();
    await pg?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  async function sql(text: string): Promise<void> {
    const { pool } = nodeDb(pg.url);
    try {
      await pool.query(text);
    } finally {
      await pool.end();
    }
  }

  /**
   * The deploy script as an operator runs it; the database URL only in its environment. Not
   * spawnSync: the child reaches Postgres through the WebSocket bridge in this process.
   */
  async function deploy(args: string[], env: Record<string, string | undefined> = { DATABASE_URL: pg.url }) {
    const child = spawn("node_modules/.bin/tsx", ["scripts/deploy.ts", ...args], {
      env: { ...process.env, DATABASE_WS_PROXY: bridge.address, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    child.stdout.on("data", (d: Buffer) => {
      output += d;
    });
    child.stderr.on("data", (d: Buffer) => {
      output += d;
    });
    const status = await new Promise<number | null>((r) => child.on("close", r));
    // The URL holds the database's password: it is never printed, whatever happened.
    expect(output).not.toContain(pg.url);
    expect(output).not.toContain("benchwright-local");
    return { status, output };
  }

  it("refuses a database whose applied file was edited since, before wrangler runs", async () => {
    const last = nth(-1);
    await sql(
      `update drizzle.__drizzle_migrations set hash = '${"0".repeat(64)}' where created_at = ${last.createdAt}`,
    );
    try {
      const outdir = join(work, "edited");
      const r = await deploy(["--env", "staging", "--dry-run", "--outdir", outdir]);
      expect(r.status, r.output).toBe(1);
      expect(r.output).toContain("refusing to deploy staging");
      expect(r.output).toContain(`migrations/${last.tag}.sql was changed after the database applied it`);
      expect(existsSync(outdir)).toBe(false);
    } finally {
      await sql(
        `update drizzle.__drizzle_migrations set hash = '${last.hash}' where created_at = ${last.createdAt}`,
      );
    }
  });

  it("refuses a database ahead of the checkout", async () => {
    const newer = nth(-1).createdAt + 60_000;
    await sql(
      `insert into drizzle.__drizzle_migrations (hash, created_at) values ('${"e".repeat(64)}', ${newer})`,
    );
    try {
      const r = await deploy(["--env", "production", "--dry-run"]);
      expect(r.status, r.output).toBe(1);
      expect(r.output).toMatch(/the database has a migration newer than this checkout/);
    } finally {
      await sql(`delete from drizzle.__drizzle_migrations where created_at = ${newer}`);
    }
  });

  it("refuses the development top level, an unknown environment, and a missing DATABASE_URL", async () => {
    expect((await deploy([])).status).toBe(2);
    const dev = await deploy(["--env", "development"]);
    expect(dev.status).toBe(2);
    expect(dev.output).toContain("no environment development in wrangler.toml");
    const none = await deploy(["--env", "staging", "--dry-run"], { DATABASE_URL: undefined });
    expect(none.status).toBe(2);
    expect(none.output).toContain("DATABASE_URL is not set");
  });

  it("a dry run on a database never migrated names every migration, builds the Worker, changes nothing", async () => {
    // The URL from the secrets file a first deploy hands wrangler, not from the environment.
    const secrets = join(work, "secrets.env");
    writeFileSync(secrets, `DATABASE_URL=${freshUrl}\nVAULT_KEK=k1:${"A".repeat(43)}=\n`, { mode: 0o600 });
    const outdir = join(work, "fresh");
    const r = await deploy(["--env", "staging", "--secrets-file", secrets, "--dry-run", "--outdir", outdir], {
      DATABASE_URL: undefined,
    });
    expect(r.status, r.output).toBe(0);
    expect(r.output).toContain(
      `migrations to apply to the staging database: ${code.map((m) => m.tag).join(", ")}`,
    );
    expect(r.output).not.toContain(freshUrl);
    expect(existsSync(join(outdir, "index.js"))).toBe(true);
    const { pool } = nodeDb(freshUrl);
    try {
      const t = await pool.query("select to_regclass('drizzle.__drizzle_migrations')::text as t");
      expect(t.rows[0]?.t).toBeNull();
    } finally {
      await pool.end();
    }
  });
});
