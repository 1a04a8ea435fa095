import { spawn } from "node:child_process";
import type { IncomingMessage } from "node:http";
import { join, resolve } from "node:path";
import type { Duplex } from "node:stream";
import { build } from "esbuild";
import { type WebSocket, WebSocketServer } from "../../scripts/lib/node-ws";
import { type Json, noSuchResource, notFound, route, status } from "./kubernetes-api";
import type { RecordedRequest } from "./kubernetes-contract";
import { execDirOf, hostsFileOf, killContainerProcesses, observe } from "./kubernetes-pods";
import { type Cluster, type Namespace, nsOf, type PodRecord, recordRequest } from "./kubernetes-store";

// pods/exec in the Kubernetes contract server (kubernetes-server.ts): the WebSocket upgrade with
// the API server's refusals, and the channel protocol (v5.channel.k8s.io, v4.channel.k8s.io: byte
// 0 of each binary message is the stream, 0 stdin, 1 stdout, 2 stderr, 3 the Status; v5's CLOSE
// signal is stream 255). A work pod's `/bw/tools/bin/bw-exec`, `bw-unpack`, `bw-collect` and
// `bw-layer` (its `/home/sandbox` the pod's home directory here) run the REAL programs (bundled by bundlePrograms) with node on this machine; the sealer's
// `bw-init seal` and `bw-init hosts` are modelled; a proxy pod answers `bw-proxy-view` only.

const RUNNER_COMMAND = "/bw/tools/bin/bw-exec";

/** The programs a pod's exec runs for real, bundled into `root`, by the command that runs each. */
export async function bundlePrograms(root: string): Promise<Record<string, string>> {
  // The real exec runner, bundled from its source (the worker tests do not build the proxy image).
  // So are bw-unpack, bw-collect and bw-layer, which a pod runs from its tools as its uid.
  const programs: Record<string, string> = {
    [RUNNER_COMMAND]: "exec-runner/main.ts",
    "/bw/tools/bin/bw-unpack": "unpack/main.ts",
    "/bw/tools/bin/bw-collect": "collect/main.ts",
    "/bw/tools/bin/bw-layer": "layer/main.ts",
    "bw-wiring": "wiring/main.ts",
  };
  const bundled: Record<string, string> = {};
  for (const [command, source] of Object.entries(programs)) {
    const outfile = join(root, source.replace(/\.ts$/, ".cjs"));
    await build({
      entryPoints: [resolve(import.meta.dirname, "../../proxy-image/src", source)],
      bundle: true,
      platform: "node",
      target: "node24",
      format: "cjs",
      outfile,
      logLevel: "warning",
    });
    bundled[command] = outfile;
  }
  return bundled;
}

function upgradeRefused(socket: Duplex, code: number, body: Json) {
  const text = JSON.stringify(body);
  socket.end(
    `HTTP/1.1 ${code} ${{ 401: "Unauthorized", 404: "Not Found", 500: "Internal Server Error" }[code] ?? "Bad Request"}\r\n` +
      `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`,
  );
}

function execSession(
  cluster: Cluster,
  ws: WebSocket,
  protocol: string,
  ns: Namespace,
  rec: PodRecord,
  container: string,
  command: string[],
  record: RecordedRequest,
) {
  const exec = record.exec as NonNullable<RecordedRequest["exec"]>;
  const finish = (exitCode: number | null, failure?: Json) => {
    exec.exitCode = exitCode;
    const st =
      failure ??
      (exitCode === 0
        ? { metadata: {}, status: "Success" }
        : {
            metadata: {},
            status: "Failure",
            message: `command terminated with non-zero exit code: error executing command [${command.join(" ")}], exit code ${exitCode}`,
            reason: "NonZeroExitCode",
            details: { causes: [{ reason: "ExitCode", message: String(exitCode) }] },
          });
    ws.send(Buffer.concat([Buffer.from([3]), Buffer.from(JSON.stringify(st))]));
    ws.close(1000);
  };
  const notFoundFailure = (): Json => ({
    metadata: {},
    status: "Failure",
    message: `OCI runtime exec failed: exec failed: unable to start container process: exec: "${command[0]}": executable file not found in $PATH: unknown`,
    reason: "InternalError",
    details: { causes: [{ message: "executable file not found" }] },
    code: 500,
  });
  if (container === "proxy") {
    // The proxy pod runs nothing here: its view is a scripted line.
    ws.on("message", () => {});
    if (command.length === 1 && command[0] === "bw-proxy-view") {
      const line = `${JSON.stringify({ contract: "bw-proxy-view", pod: (rec.obj.metadata as Json).name })}\n`;
      ws.send(Buffer.concat([Buffer.from([1]), Buffer.from(line)]));
      finish(0);
    } else {
      finish(null, notFoundFailure());
    }
    return;
  }
  let argv = command;
  let stdinFilter: ((line: string) => string) | null = null;
  if (container === "bw-seal") {
    const out = (text: string) => ws.send(Buffer.concat([Buffer.from([1]), Buffer.from(text)]));
    if (command[0] === "bw-init" && command[1] === "seal" && command.length === 3) {
      ws.on("message", () => {});
      const statuses = ((rec.obj.status as Json).containerStatuses ?? []) as Json[];
      const setup = statuses.find((c) => c.name === "setup");
      const ours = setup && String(setup.containerID) === `containerd://${command[2]}`;
      const killed = ours ? killContainerProcesses(rec, "setup") : 0;
      if (ours && !ns.options.setupSurvivesSeal) {
        // Its main process (the runner's hold) killed: the container ends, as the kubelet reports it.
        setup.state = { terminated: { exitCode: 137, reason: "Error" } };
        setup.ready = false;
      }
      out(`${JSON.stringify({ killed })}\n`);
      finish(0);
      return;
    }
    if (command[0] === "bw-init" && command[1] === "hosts" && command.length === 2) {
      // `head -n 1 | bw-wiring reinstall` on the pod's hosts file (this machine's paths).
      argv = ["bw-wiring", "reinstall"];
      stdinFilter = (line) => {
        const input = JSON.parse(line) as Json;
        if (input.hostsPath !== "/etc/hosts") throw new Error("the sealer rewrites /etc/hosts only");
        return `${JSON.stringify({ ...input, hostsPath: hostsFileOf(rec) })}\n`;
      };
    } else {
      finish(null, notFoundFailure());
      return;
    }
  }
  const program = cluster.bundled[argv[0] as string];
  // bw-wiring is on the sealer's PATH (the proxy image); the work image has only /bw/tools.
  if (!program || (argv[0] === "bw-wiring") !== (container === "bw-seal")) {
    finish(null, notFoundFailure());
    return;
  }
  // The pod's working directory is its home volume, a directory of this machine here.
  if (argv[0] === "/bw/tools/bin/bw-layer") {
    argv = argv.map((a) => (a === "/home/sandbox" ? join(rec.dir, "home") : a));
  }
  const child = spawn(process.execPath, [program, ...argv.slice(1)], {
    cwd: rec.dir,
    env: {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      HOME: join(rec.dir, "home"),
      BW_EXEC_DIR: execDirOf(rec, container),
    },
    stdio: ["pipe", "pipe", "pipe"],
  });
  cluster.children.add(child);
  child.stdin.on("error", () => {});
  let line = "";
  ws.on("message", (data: Buffer) => {
    if (data.length === 0) return;
    if (data[0] === 0 && stdinFilter) {
      // One line, then stdin ends (as `head -n 1` ends it).
      exec.stdinBytes += data.length - 1;
      line += data.subarray(1).toString("utf8");
      const nl = line.indexOf("\n");
      if (nl !== -1 && !child.stdin.writableEnded) {
        exec.stdin = line.slice(0, nl + 1).slice(0, 64 * 1024);
        try {
          child.stdin.end(stdinFilter(line.slice(0, nl)));
        } catch {
          child.stdin.end("not json\n");
        }
      }
      return;
    }
    if (data[0] === 0) {
      // Text as text (the runner's JSON line); a binary stdin (a bundle) is counted, not kept.
      exec.stdinBytes += data.length - 1;
      if (exec.stdinBytes <= 64 * 1024) exec.stdin += data.subarray(1).toString("utf8");
      child.stdin.write(data.subarray(1));
    } else if (data[0] === 255 && protocol === "v5.channel.k8s.io" && data[1] === 0) {
      exec.closedStdin = true;
      child.stdin.end();
    }
  });
  child.stdout.on("data", (d: Buffer) => ws.send(Buffer.concat([Buffer.from([1]), d])));
  child.stderr.on("data", (d: Buffer) => ws.send(Buffer.concat([Buffer.from([2]), d])));
  child.on("close", (code) => {
    cluster.children.delete(child);
    finish(code ?? 1);
  });
  ws.on("close", () => {
    if (child.exitCode === null) child.kill("SIGKILL");
  });
}

/** A pods/exec upgrade: refused as the API server refuses it, or a session over the WebSocket. */
export function execUpgrade(cluster: Cluster, req: IncomingMessage, socket: Duplex, head: Buffer) {
  const url = new URL(req.url ?? "/", "http://127.0.0.1");
  const command = url.searchParams.getAll("command");
  const container = url.searchParams.get("container");
  const record = recordRequest(cluster, req, url, {
    contentType: null,
    exec: {
      protocol: null,
      command,
      container,
      stdin: "",
      stdinBytes: 0,
      closedStdin: false,
      exitCode: null,
    },
  });
  const refuse = (code: number, body: Json) => {
    record.status = code;
    upgradeRefused(socket, code, body);
  };
  if (record.auth !== "ok") return refuse(401, status(401, "Unauthorized", "Unauthorized"));
  const r = route(url.pathname);
  if (r?.resource !== "pods" || r.sub !== "exec" || !r.name) {
    return refuse(404, noSuchResource()[1] as Json);
  }
  const ns = nsOf(cluster, r.ns);
  const rec = observe(cluster, ns, r.name, true);
  if (!rec) return refuse(404, notFound("pods", r.name).body);
  if (rec.terminatingReads !== null || (rec.obj.status as Json).phase !== "Running") {
    return refuse(400, status(400, "BadRequest", `pod ${r.name} is not running`));
  }
  const containers = ((rec.obj.spec as Json).containers as Json[]).map((c) => c.name);
  if (!container || !containers.includes(container)) {
    return refuse(400, status(400, "BadRequest", `container ${container} is not valid for pod ${r.name}`));
  }
  const state = (((rec.obj.status as Json).containerStatuses ?? []) as Json[]).find(
    (c) => c.name === container,
  )?.state as Json | undefined;
  if (!state?.running) {
    // The kubelet's answer for an exec into a container that ended (or never started).
    return refuse(500, status(500, "InternalError", `container not found ("${container}")`));
  }
  if (command.length === 0)
    return refuse(400, status(400, "BadRequest", "you must specify at least 1 command"));
  const offered = String(req.headers["sec-websocket-protocol"] ?? "")
    .split(",")
    .map((p) => p.trim());
  const speaks = ns.options.execProtocols ?? ["v5.channel.k8s.io", "v4.channel.k8s.io"];
  const protocol = speaks.find((p) => offered.includes(p));
  if (!protocol) return refuse(400, status(400, "BadRequest", "no supported channel protocol was requested"));
  record.status = 101;
  (record.exec as NonNullable<RecordedRequest["exec"]>).protocol = protocol;
  const handler = new WebSocketServer({ noServer: true, handleProtocols: () => protocol });
  handler.handleUpgrade(req, socket, head, (ws) =>
    execSession(cluster, ws, protocol, ns, rec, container, command, record),
  );
}
