// The local host agent (docs/local-backend.md): `tsx local-agent/main.ts [options]`, as root.
//   --port N                 port on 127.0.0.1 (default 8790; 0: any free port, printed)
//   --secret-file PATH       the shared secret (else env LOCAL_AGENT_SECRET), at least 16 chars
//   --control-plane URL      where the control plane listens (default http://127.0.0.1:8787)
//   --nft PATH               nft binary (default nft)
//   --state-dir PATH         default /run/benchwright
//   --layers-dir PATH        the setup layers kept (default /var/lib/benchwright/setup-layers)
// SIGTERM / SIGINT destroy every sandbox the agent made, then exit.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { logLine } from "@benchwright/shared/contract/log";
import { LAYERS_DIR } from "./layers";
import { startAgent } from "./server";

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "8790" },
    "secret-file": { type: "string" },
    "control-plane": { type: "string", default: "http://127.0.0.1:8787" },
    nft: { type: "string", default: "nft" },
    "state-dir": { type: "string", default: "/run/benchwright" },
    "layers-dir": { type: "string", default: LAYERS_DIR },
  },
  strict: true,
});

/** A refusal to start: one log line like the rest (its `detail` for the operator), then exit 2. */
function fail(detail: string): never {
  process.stderr.write(`${logLine("error", { event: "agent_start_failed", detail })}\n`);
  process.exit(2);
}

const secret = values["secret-file"]
  ? readFileSync(values["secret-file"], "utf8").trim()
  : (process.env.LOCAL_AGENT_SECRET ?? "");
if (secret.length < 16)
  fail("no agent secret: pass --secret-file or set LOCAL_AGENT_SECRET (16+ characters)");
// The sandboxes never see this environment, and neither does anything the agent starts.
delete process.env.LOCAL_AGENT_SECRET;
const port = Number(values.port);
if (!Number.isInteger(port) || port < 0 || port > 65_535) fail(`--port ${values.port} is not a port`);

const agent = await startAgent({
  secret,
  port,
  controlPlane: values["control-plane"],
  nft: values.nft,
  stateDir: values["state-dir"],
  layersDir: values["layers-dir"],
}).catch((error: unknown) => fail(`local-agent failed to start: ${(error as Error).message}`));
process.stdout.write(`${logLine("info", { event: "listening", url: agent.url, port: agent.port })}\n`);

let stopping = false;
for (const signal of ["SIGTERM", "SIGINT"] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    agent.close().then(
      () => process.exit(0),
      (error: unknown) => {
        const name = error instanceof Error ? error.name : "unknown";
        process.stderr.write(`${logLine("error", { event: "agent_close_failed", error: name })}\n`);
        process.exit(1);
      },
    );
  });
}
