import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

// A throwaway cluster of the machine's real PostgreSQL, for tests and CI. (The embedded PGlite,
// for npm start and machines without PostgreSQL, is in pglite-bridge.ts.)
export interface LocalPostgres {
  readonly kind: "postgresql";
  readonly host: string;
  readonly port: number;
  readonly url: string;
  /** A role that may sign in only with SCRAM-SHA-256 (set when the cluster's default is not). */
  readonly scramUrl: string | null;
  stop(): Promise<void>;
}

const PASSWORD = "benchwright-local";
const SCRAM_ROLE = "bw_scram";

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      const port = typeof addr === "object" && addr ? addr.port : 0;
      srv.close(() => resolve(port));
    });
  });
}

/** Directory holding initdb/postgres/pg_ctl, or null when PostgreSQL is not installed. */
export function findPostgresBin(): string | null {
  const base = "/usr/lib/postgresql";
  if (existsSync(base)) {
    const versions = readdirSync(base)
      .filter((v) => existsSync(join(base, v, "bin", "initdb")))
      .sort((a, b) => Number(b) - Number(a));
    if (versions[0]) return join(base, versions[0], "bin");
  }
  try {
    const initdb = execFileSync("sh", ["-c", "command -v initdb"], { encoding: "utf8" }).trim();
    return initdb ? initdb.replace(/\/initdb$/, "") : null;
  } catch {
    return null;
  }
}

/**
 * Starts a throwaway PostgreSQL cluster on a free loopback port; removed again on stop().
 * signIn "scram" (the default, as on Neon): every connection signs in with SCRAM-SHA-256.
 * "password": the cluster's own role sends its password in clear over loopback, because SCRAM's
 * key stretching on every connection (the Worker opens one per request) is a third of the test
 * suites' time; a second role (scramUrl) still signs in only with SCRAM, so that path is tested.
 */
export async function startPostgresql(
  bin: string,
  options: { signIn?: "scram" | "password" } = {},
): Promise<LocalPostgres> {
  const dir = mkdtempSync(join(tmpdir(), "benchwright-pg-"));
  const data = join(dir, "data");
  const pwfile = join(dir, "pw");
  writeFileSync(pwfile, PASSWORD);
  // initdb and postgres refuse to run as root: run them as the `postgres` system user then
  // (spawned with its uid directly, so signals reach postgres itself, not a wrapper).
  const user = process.getuid?.() === 0 ? systemUser("postgres") : {};
  if ("uid" in user) {
    chmodSync(dir, 0o755);
    execFileSync("chown", ["-R", "postgres", dir]);
  }
  execFileSync(
    join(bin, "initdb"),
    ["-D", data, "-U", "postgres", "--auth=scram-sha-256", `--pwfile=${pwfile}`, "--no-sync"],
    { stdio: "ignore", ...user },
  );
  if (options.signIn === "password") {
    writeFileSync(
      join(data, "pg_hba.conf"),
      [
        "# Written by scripts/lib/postgres.ts for a throwaway test cluster (see startPostgresql).",
        "local all all scram-sha-256",
        `host all ${SCRAM_ROLE} 127.0.0.1/32 scram-sha-256`,
        "host all all 127.0.0.1/32 password",
        "",
      ].join("\n"),
    );
  }
  const port = await freePort();
  const child = spawn(
    join(bin, "postgres"),
    [
      "-D",
      data,
      "-p",
      String(port),
      "-k",
      dir,
      "-c",
      "listen_addresses=127.0.0.1",
      "-c",
      "fsync=off",
      "-c",
      "full_page_writes=off",
      "-c",
      "max_connections=200",
    ],
    { stdio: ["ignore", "ignore", "pipe"], ...user },
  );
  let log = "";
  child.stderr?.on("data", (d) => {
    log += String(d);
  });
  await waitForReady(child, () => log);
  let scramUrl: string | null = null;
  if (options.signIn === "password") {
    // Stored as a SCRAM verifier (password_encryption's default); a superuser, to reach every table.
    execFileSync(
      join(bin, "psql"),
      [
        "-h",
        "127.0.0.1",
        "-p",
        String(port),
        "-U",
        "postgres",
        "-d",
        "postgres",
        "-qAt",
        "-v",
        "ON_ERROR_STOP=1",
        "-c",
        `create role ${SCRAM_ROLE} login superuser password '${PASSWORD}'`,
      ],
      { stdio: "ignore", env: { ...process.env, PGPASSWORD: PASSWORD } },
    );
    scramUrl = `postgres://${SCRAM_ROLE}:${PASSWORD}@127.0.0.1:${port}/postgres`;
  }
  return {
    kind: "postgresql",
    host: "127.0.0.1",
    port,
    url: `postgres://postgres:${PASSWORD}@127.0.0.1:${port}/postgres`,
    scramUrl,
    stop: async () => {
      await stopChild(child);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

function systemUser(name: string): { uid: number; gid: number } {
  const id = (flag: string) => Number(execFileSync("id", [flag, name], { encoding: "utf8" }).trim());
  try {
    return { uid: id("-u"), gid: id("-g") };
  } catch {
    throw new Error(
      `running as root needs the '${name}' system user (apt-get install postgresql creates it)`,
    );
  }
}

async function waitForReady(child: ChildProcess, log: () => string): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!log().includes("ready to accept connections")) {
    if (child.exitCode !== null) throw new Error(`postgres exited early:\n${log()}`);
    if (Date.now() > deadline) throw new Error(`postgres did not start in 30 s:\n${log()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const exited = new Promise((r) => child.once("exit", r));
  child.kill("SIGINT"); // postgres "fast" shutdown
  await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))]);
  if (child.exitCode === null) child.kill("SIGKILL");
}

/** PGlite (embedded Postgres in WebAssembly) on a loopback TCP port; `dataDir` keeps its data. */
