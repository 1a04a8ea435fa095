import { spawnSync } from "node:child_process";
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestProject } from "vitest/node";
import { freePort } from "../../scripts/lib/postgres";
import { startWorkerDev } from "../../scripts/lib/worker-dev";
import startDatabase from "./database";

// The CLI's suite talks to the API over real HTTP, as a user's machine would: the database of the
// worker tests, then `wrangler dev` serving the Worker on loopback, and the CLI bundle built
// from the current sources. No compute backend: these tests launch no sandbox.
declare module "vitest" {
  export interface ProvidedContext {
    apiUrl: string;
  }
}

export default async function setup(project: TestProject) {
  const stopDatabase = await startDatabase(project);
  const built = spawnSync("npm", ["run", "--silent", "build:cli"], { stdio: "inherit" });
  if (built.status !== 0) throw new Error("npm run build:cli failed");
  const dir = mkdtempSync(join(tmpdir(), "bw-cli-"));
  chmodSync(dir, 0o700);
  const context = project.getProvidedContext();
  let worker: Awaited<ReturnType<typeof startWorkerDev>>;
  try {
    worker = await startWorkerDev({
      port: await freePort(),
      envFile: join(dir, "worker.vars"),
      persistTo: join(dir, "wrangler-state"),
      secrets: {
        DATABASE_URL: context.databaseUrl,
        VAULT_KEK: context.vaultKek,
        // Unused: no compute backend answers; the suite launches nothing that reaches one.
        COMPUTE_BACKEND_SECRET: "unused-in-the-cli-suite",
      },
      vars: { DATABASE_WS_PROXY: context.databaseWsProxy },
    });
  } catch (error) {
    await stopDatabase();
    throw error;
  }
  project.provide("apiUrl", worker.url);
  return async () => {
    await worker.stop();
    await stopDatabase();
    rmSync(dir, { recursive: true, force: true });
  };
}
