import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { type RunningAgent, startAgent } from "../../local-agent/server";
import { ensureWorkImage } from "./images";
import { freePort } from "./postgres";
import { startWorkerDev, type WorkerDev } from "./worker-dev";

// The whole control plane on one machine, as `npm start` and the end-to-end tests run it: the
// proxy image's programs and the work image built (both cached), the local host agent
// (namespaces), and `wrangler dev` serving the Worker with the agent as its compute backend. The
// database is the caller's.

export interface LocalStack {
  apiUrl: string;
  /** The broker's credential for the agent (tests prove no sandbox ever sees it). */
  agentSecret: string;
  agent: RunningAgent;
  worker: WorkerDev;
  /**
   * Stops `wrangler dev` (the whole control plane: API, Durable Objects, internal routes) and,
   * after `downMs`, starts it again on the same port with the same Durable Object state: an outage
   * the run's proxy and the host agent live through (tests of spooling and recovery).
   */
  restartWorker: (downMs: number) => Promise<void>;
  stop: () => Promise<void>;
}

export async function startLocalStack(options: {
  databaseUrl: string;
  /** host:port of the WebSocket→TCP bridge in front of the database. */
  wsProxy: string;
  vaultKek: string;
  /** A private (0700) directory for the Worker's env file and Durable Object state. */
  dir: string;
  port?: number;
  /** Test-only proxy settings (the demo's or the suite's own upstream CA and routes). */
  proxyTestEnv?: Record<string, string>;
  agentStateDir?: string;
  /** Where the agent keeps setup layers (default /var/lib/benchwright/setup-layers). */
  agentLayersDir?: string;
  nft?: string;
  /** More Worker vars (e.g. a short LINGER_IDLE_SECONDS for a test). */
  workerVars?: Record<string, string>;
  log?: (line: string) => void;
}): Promise<LocalStack> {
  buildProxyImage();
  // The sandboxes' root filesystem: the agent exports the work image on start (once per image
  // id). Without it the agent says why in its health, and every run stops with that reason.
  const work = await ensureWorkImage();
  if (work) (options.log ?? console.warn)(`[images] no work image, so no sandbox: ${work}`);
  const port = options.port ?? (await freePort());
  // The broker's credential for the agent: made here, given to the two of them only.
  const agentSecret = randomBytes(32).toString("base64url");
  const agent = await startAgent({
    secret: agentSecret,
    port: 0,
    controlPlane: `http://127.0.0.1:${port}`,
    proxyTestEnv: options.proxyTestEnv,
    stateDir: options.agentStateDir,
    layersDir: options.agentLayersDir,
    nft: options.nft,
    log: (event) => options.log?.(`[agent] ${JSON.stringify(event)}`),
  });
  const workerOptions: Parameters<typeof startWorkerDev>[0] = {
    port,
    envFile: join(options.dir, "worker.vars"),
    persistTo: join(options.dir, "wrangler-state"),
    secrets: {
      DATABASE_URL: options.databaseUrl,
      VAULT_KEK: options.vaultKek,
      COMPUTE_BACKEND_SECRET: agentSecret,
    },
    vars: {
      ...options.workerVars,
      DATABASE_WS_PROXY: options.wsProxy,
      COMPUTE_BACKEND_URL: agent.url,
      COMPUTE_BACKEND: "local",
    },
    log: (line) => options.log?.(`[wrangler] ${line}`),
  };
  let worker: WorkerDev;
  try {
    worker = await startWorkerDev(workerOptions);
  } catch (error) {
    await agent.close();
    throw error;
  }
  const stack: LocalStack = {
    apiUrl: worker.url,
    agentSecret,
    agent,
    worker,
    restartWorker: async (downMs) => {
      await worker.stop();
      await new Promise((r) => setTimeout(r, downMs));
      worker = await startWorkerDev(workerOptions);
      stack.worker = worker;
    },
    stop: async () => {
      await worker.stop();
      await agent.close();
    },
  };
  return stack;
}

/** proxy-image/dist/{proxy,wiring}.cjs, which the agent mounts into every sandbox. */
export function buildProxyImage(): void {
  const build = spawnSync("npm", ["run", "--silent", "build:proxy"], { stdio: "inherit" });
  if (build.status !== 0) throw new Error("npm run build:proxy failed");
}
