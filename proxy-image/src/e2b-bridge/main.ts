// `bw-bridge`, the E2B templates' bridge between a work sandbox and its run's proxy sandbox (see
// bridge.ts), as a command. Configured by environment only (the tokens must not show in a
// process list):
//
//   bw-bridge serve     BW_BRIDGE_TOKEN; BW_BRIDGE_HOST (0.0.0.0), BW_BRIDGE_PORT (8090),
//                       BW_BRIDGE_TLS_TARGET (8443), BW_BRIDGE_HTTP_TARGET (8080)
//   bw-bridge connect   BW_BRIDGE_URL, BW_BRIDGE_TOKEN, BW_BRIDGE_EDGE_TOKEN (optional);
//                       BW_BRIDGE_LISTEN (127.0.0.1), BW_BRIDGE_TLS_PORT (443), BW_BRIDGE_HTTP_PORT (80)
//
// Prints one JSON line {"event":"listening",...} once it listens (the broker waits for it), then
// runs until killed. A bad configuration exits 2 with the reason on stderr.

import { levelOf, logLine } from "@benchwright/shared/contract/log";
import { forward, portOf, serve } from "./bridge";

function setting(name: string, fallback?: string): string {
  const value = process.env[name] || fallback;
  if (value === undefined) throw new Error(`${name} is not set`);
  return value;
}

function port(name: string, fallback: string): number {
  const value = setting(name, fallback);
  const n = Number(value);
  if (!/^[0-9]{1,5}$/.test(value) || n < 1 || n > 65_535) throw new Error(`${name} is not a port`);
  return n;
}

async function main(verb: string | undefined): Promise<void> {
  const token = setting("BW_BRIDGE_TOKEN");
  if (token.length < 32) throw new Error("BW_BRIDGE_TOKEN is too short");
  if (verb === "serve") {
    const server = await serve({
      host: setting("BW_BRIDGE_HOST", "0.0.0.0"),
      port: port("BW_BRIDGE_PORT", "8090"),
      token,
      targets: { tls: port("BW_BRIDGE_TLS_TARGET", "8443"), http: port("BW_BRIDGE_HTTP_TARGET", "8080") },
      log: (r) => process.stdout.write(`${logLine(levelOf(r), r)}\n`),
    });
    process.stdout.write(`${logLine("info", { event: "listening", port: portOf(server) })}\n`);
    return;
  }
  if (verb === "connect") {
    const edgeToken = process.env.BW_BRIDGE_EDGE_TOKEN;
    const { tls, http } = await forward({
      url: setting("BW_BRIDGE_URL"),
      token,
      ...(edgeToken ? { edgeToken } : {}),
      host: setting("BW_BRIDGE_LISTEN", "127.0.0.1"),
      ports: { tls: port("BW_BRIDGE_TLS_PORT", "443"), http: port("BW_BRIDGE_HTTP_PORT", "80") },
    });
    process.stdout.write(
      `${logLine("info", { event: "listening", tls: portOf(tls), http: portOf(http) })}\n`,
    );
    return;
  }
  throw new Error("usage: bw-bridge serve|connect");
}

main(process.argv[2]).catch((e: unknown) => {
  // One log line like the rest, the message (a setting's name, never its value) as its detail.
  const detail = e instanceof Error ? e.message : String(e);
  process.stderr.write(`${logLine("error", { event: "bridge_start_failed", detail })}\n`);
  process.exit(2);
});
