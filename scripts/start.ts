// `npm start`: the control plane on this machine. An embedded Postgres (PGlite, data kept in
// .data/pglite) unless DATABASE_URL is set, the committed migrations, a dev user with an API
// key, and `wrangler dev` serving the API on http://127.0.0.1:8787.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { eq } from "drizzle-orm";
import { provisionApiKey } from "../src/auth/provision";
import { hashApiKey } from "../src/crypto/api-keys";
import { apiKeys } from "../src/db/schema";
import { applyMigrations } from "./lib/migrate";
import { configureNeonForNode, nodeDb } from "./lib/neon-node";
import { startPglite } from "./lib/postgres";
import { startWsBridge } from "./lib/ws-bridge";

const DATA = join(process.cwd(), ".data");
const PORT = Number(process.env.PORT ?? 8787);
const DEV_EMAIL = "dev@localhost";

function readOrCreate(file: string, make: () => string): string {
  const path = join(DATA, file);
  if (existsSync(path)) return readFileSync(path, "utf8").trim();
  const value = make();
  writeFileSync(path, `${value}\n`, { mode: 0o600 });
  return value;
}

async function main() {
  mkdirSync(DATA, { recursive: true });
  const stops: Array<() => Promise<void>> = [];

  let databaseUrl = process.env.DATABASE_URL;
  let wsProxy = "";
  if (!databaseUrl) {
    const pg = await startPglite(join(DATA, "pglite"));
    stops.push(() => pg.stop());
    const bridge = await startWsBridge({ host: pg.host, port: pg.port });
    stops.push(() => bridge.close());
    databaseUrl = pg.url;
    wsProxy = bridge.address;
  }
  configureNeonForNode(wsProxy || undefined);
  await applyMigrations(databaseUrl);

  // The dev key is kept (0600) in .data so a restart prints the same key; the database keeps
  // only its hash, as for every key.
  const { db, pool } = nodeDb(databaseUrl);
  let devKey = existsSync(join(DATA, "dev-api-key"))
    ? readFileSync(join(DATA, "dev-api-key"), "utf8").trim()
    : "";
  const known = devKey
    ? await db
        .select({ id: apiKeys.id })
        .from(apiKeys)
        .where(eq(apiKeys.hash, await hashApiKey(devKey)))
    : [];
  if (known.length === 0) {
    devKey = (await provisionApiKey(db, { email: DEV_EMAIL, keyName: "npm start" })).key;
    writeFileSync(join(DATA, "dev-api-key"), `${devKey}\n`, { mode: 0o600 });
  }
  await pool.end();

  const kek =
    process.env.VAULT_KEK ?? readOrCreate("vault-kek", () => `dev1:${randomBytes(32).toString("base64")}`);
  const envFile = join(DATA, "dev.vars");
  writeFileSync(envFile, `DATABASE_URL=${JSON.stringify(databaseUrl)}\nVAULT_KEK=${JSON.stringify(kek)}\n`, {
    mode: 0o600,
  });

  const wrangler = spawn(
    join(process.cwd(), "node_modules", ".bin", "wrangler"),
    [
      "dev",
      "--ip",
      "127.0.0.1",
      "--port",
      String(PORT),
      "--env-file",
      envFile,
      "--var",
      `DATABASE_WS_PROXY:${wsProxy}`,
      "--show-interactive-dev-session=false",
    ],
    {
      stdio: ["ignore", "pipe", "inherit"],
      // This machine reaches no network but package registries: no Request.cf download, no telemetry.
      env: { ...process.env, CLOUDFLARE_CF_FETCH_ENABLED: "false", WRANGLER_SEND_METRICS: "false" },
    },
  );
  wrangler.stdout.on("data", (d) => process.stdout.write(`[wrangler] ${d}`));
  const shutdown = async () => {
    wrangler.kill("SIGTERM");
    for (const stop of stops.reverse()) await stop().catch(() => {});
    process.exit(0);
  };
  process.on("SIGINT", shutdown);
  process.on("SIGTERM", shutdown);
  wrangler.on("exit", (code) => {
    console.error(`wrangler dev exited (${code})`);
    void shutdown();
  });

  const base = `http://127.0.0.1:${PORT}`;
  await waitFor(`${base}/v1/openapi.json`);
  console.log(`
Benchwright boundary is up (database: ${wsProxy ? "embedded PGlite in .data/pglite" : "DATABASE_URL"}).
  API        ${base}/v1
  OpenAPI    ${base}/v1/openapi.json
  Dev user   ${DEV_EMAIL}
  API key    ${devKey}

Try:
  export BW_KEY=${devKey}
  curl -s -H "authorization: Bearer $BW_KEY" ${base}/v1/vault/policy-preview
`);
}

async function waitFor(url: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    try {
      if ((await fetch(url)).ok) return;
    } catch {}
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`${url} did not come up within 60 s`);
}

main().catch((e) => {
  console.error(e instanceof Error ? e.message : e);
  process.exit(1);
});
