import { type ChildProcess, spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

// `wrangler dev` for the Worker on loopback, as `npm start` and the end-to-end tests run it.
// Secrets go through an env file (0600), never the command line; vars through --var.

export interface WorkerDev {
  url: string;
  stop: () => Promise<void>;
  process: ChildProcess;
}

export async function startWorkerDev(options: {
  port: number;
  /** Written to `envFile` (0600): DATABASE_URL, VAULT_KEK, COMPUTE_BACKEND_SECRET... */
  secrets: Record<string, string>;
  envFile: string;
  vars: Record<string, string>;
  /** Where wrangler keeps Durable Object state between restarts. */
  persistTo?: string;
  /** Another entry point than wrangler.toml's `main` (a bench's Worker), with its own ready path. */
  script?: string;
  readyPath?: string;
  log?: (line: string) => void;
}): Promise<WorkerDev> {
  writeFileSync(
    options.envFile,
    Object.entries(options.secrets)
      .map(([k, v]) => `${k}=${JSON.stringify(v)}\n`)
      .join(""),
    { mode: 0o600 },
  );
  const args = [
    "dev",
    ...(options.script ? [options.script] : []),
    "--ip",
    "127.0.0.1",
    "--port",
    String(options.port),
    "--env-file",
    options.envFile,
    "--show-interactive-dev-session=false",
    "--inspector-port",
    "0",
    // Serves /__scheduled, the only way a cron trigger fires in `wrangler dev`.
    "--test-scheduled",
    ...(options.persistTo ? ["--persist-to", options.persistTo] : []),
    ...Object.entries(options.vars).flatMap(([k, v]) => ["--var", `${k}:${v}`]),
  ];
  const child = spawn(join(process.cwd(), "node_modules", ".bin", "wrangler"), args, {
    stdio: ["ignore", "pipe", "pipe"],
    // This machine reaches no network but package registries: no Request.cf download, no telemetry.
    env: { ...process.env, CLOUDFLARE_CF_FETCH_ENABLED: "false", WRANGLER_SEND_METRICS: "false" },
    detached: true,
  });
  const log = options.log ?? (() => {});
  let tail = "";
  // Whole lines only: a chunk may end mid-line (callers match on lines). One rest per stream.
  const lines = () => {
    let rest = "";
    return (d: Buffer) => {
      const text = d.toString();
      tail = (tail + text).slice(-4000);
      const parts = (rest + text).split("\n");
      rest = parts.pop() ?? "";
      for (const line of parts) if (line.trim()) log(line);
    };
  };
  child.stdout?.on("data", lines());
  child.stderr?.on("data", lines());
  const url = `http://127.0.0.1:${options.port}`;
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once("exit", r));
    try {
      process.kill(-(child.pid as number), "SIGTERM"); // wrangler and its workerd
    } catch {}
    await Promise.race([exited, new Promise((r) => setTimeout(r, 5000))]);
    try {
      process.kill(-(child.pid as number), "SIGKILL");
    } catch {}
  };
  const deadline = Date.now() + 90_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`wrangler dev exited (${child.exitCode}):\n${tail}`);
    try {
      if ((await fetch(`${url}${options.readyPath ?? "/v1/openapi.json"}`)).ok)
        return { url, stop, process: child };
    } catch {}
    await new Promise((r) => setTimeout(r, 250));
  }
  await stop();
  throw new Error(`wrangler dev did not answer within 90 s:\n${tail}`);
}
