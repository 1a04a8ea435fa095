import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmdirSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import type { components } from "e2b";
import { build } from "esbuild";
import type { TestProject } from "vitest/node";
import { recordedExecs } from "../../proxy-image/src/exec-runner/exec-runner";
import { cgroup2Mount } from "../../proxy-image/src/exec-runner/exec-seal";
import { E2B_TEMPLATES } from "../../scripts/lib/e2b-templates";
import { HttpError, id20, templateBuilds } from "./e2b-builds";
import type {
  ContractSandbox,
  E2bBuildFault,
  E2bContractInfo,
  E2bFaults,
  RecordedE2bRequest,
} from "./e2b-contract";

// CONTRACT SERVER, not E2B: what the `e2b` SDK (2.51.0) calls, written from E2B's published
// OpenAPI spec as that SDK carries it (its generated `paths`/`components` types) and envd's
// process.proto, on loopback; re-checked against E2B's open-source API (e2b-dev/infra, Aug 2026)
// for the answers the spec leaves open. E2B's cloud cannot be reached from here; the real SDK
// talks to this instead, pointed at it with its documented `apiUrl` and `sandboxUrl` options.
//
// Platform API (X-API-KEY, JSON, errors as {code, message}):
//   POST   /v2/sandboxes                       NewSandboxV2 → 201 Sandbox; templateID names a
//                                              built template (name[:tag] or id; else 404
//                                              "template '…' not found"), answered as E2B does:
//                                              templateID = the template's id, alias = its name
//   GET    /v2/sandboxes?metadata=&state=&limit=&nextToken=   ListedSandbox[] (+ X-Next-Token)
//   GET    /sandboxes/{id}                     SandboxDetail
//   DELETE /sandboxes/{id}                     204 | 404
//   POST   /sandboxes/{id}/pause               204 | 409 already paused | 404
//   POST   /v2/sandboxes/{id}/connect          200 running | 201 resumed (TTL only extended)
//   POST   /sandboxes/{id}/timeout             204
//   PUT    /sandboxes/{id}/network             204 (replaces the egress configuration; 409 paused)
//   the template build API (V2 builder) of `Template.build`: see e2b-builds.ts
//
// envd (E2b-Sandbox-Id selects the sandbox, X-Access-Token must be its envdAccessToken, the user
// is the Basic authorization's name), Connect protocol with the JSON codec as the SDK sends it:
//   process.Process/Start, /Connect  (server streaming, application/connect+json envelopes)
//   process.Process/List, /SendInput, /SendSignal, /CloseStdin  (unary, application/json)
//   GET /health                                                  204
//   GET  /files?path=&username=     the file's bytes (application/octet-stream) | 404 | 400 a dir
//   POST /files?path=&username=     multipart/form-data (`file` parts) or application/octet-stream
//                                   → 200 [EntryInfo]; parent directories made
//   (envd's files API from envd.yaml, `info.version` 0.1.1 in e2b-dev/infra, as SDK 2.51.0's
//   generated types carry it; answers as in its examples: errors {code, message}, 401 for an
//   unknown user)
//
// Filesystem model (documented, not E2B's): each sandbox's home, for every user, is its
// directory on this machine; a relative path resolves there (as envd resolves it against the
// user's home) and an absolute path must lie inside it (400 otherwise). The file's owner is this
// machine's test user whatever the `username`, which is recorded, and must be root or user.
//
// Process model (documented, not E2B's): a command arrives as `/bin/bash -l -c <string>`; the
// string is split as the shell would split the backend's quoted words (no other shell syntax is
// accepted) and run by program name:
//   bw-exec          the REAL runner (proxy-image/src/exec-runner/main.ts, built here), as a real
//                    process, with its state under this sandbox's directory. The commands it runs
//                    are real processes too: `sh -c ...` from the tests runs on this machine, and
//                    the images' programs are stand-ins on PATH: bw-proxy and bw-bridge print a
//                    line and sleep, bw-wiring reads its stdin and prints {"ok":true,"standIn":true}
//                    (`bw-wiring reinstall`: {"ok":true,"hostsEntries":[]}),
//                    bw-proxy-view prints {}.
//                    bw-unpack and bw-collect are the REAL programs (unpack/main.ts, collect/main.ts,
//                    built here). `bw-exec seal` runs for real too, on a cgroup of the sandbox's
//                    own under this machine's cgroup v2 (BW_EXEC_SETUP_CGROUP, when there is one),
//                    but without --sweep, which is recorded and dropped: the sweep takes every
//                    process started since the first setup command, on this machine that is not
//                    the sandbox's alone (the sweep is tested in test/unit/exec-seal.test.ts).
//   bw-drop-root,    the work template's setup scripts, scripted: exit 0 and print "ok", unless
//   bw-check-user,   a fault for the sandbox's run says otherwise (bw-drop-root and bw-workdir
//   bw-redirect,     never fail).
//   bw-workdir
//   anything else    exit 127.
// Every process runs as this machine's test user: the envd `user` is recorded, not enforced. A
// paused sandbox's processes are stopped (SIGSTOP) and continued on resume; envd calls to it are
// answered 502 as E2B's edge does. Timeouts are recorded, never enforced (no sandbox expires).
// Every request is recorded (GET /_contract/requests); faults per run: POST /_contract/faults;
// template builds and uploaded layers: GET /_contract/templates; a failing build: POST
// /_contract/build-faults.

type Schemas = components["schemas"];

const ENVD_VERSION = "0.5.8";
const PAGE_MAX = 100;

export async function buildE2bPrograms(
  outDir: string,
): Promise<{ exec: string; bridge: string; unpack: string; collect: string }> {
  const root = resolve(import.meta.dirname, "../..");
  const out = {
    exec: join(outDir, "exec.cjs"),
    bridge: join(outDir, "e2b-bridge.cjs"),
    unpack: join(outDir, "unpack.cjs"),
    collect: join(outDir, "collect.cjs"),
  };
  for (const [entry, file] of [
    ["proxy-image/src/exec-runner/main.ts", out.exec],
    ["proxy-image/src/e2b-bridge/main.ts", out.bridge],
    ["proxy-image/src/unpack/main.ts", out.unpack],
    ["proxy-image/src/collect/main.ts", out.collect],
  ] as const) {
    await build({
      entryPoints: [join(root, entry)],
      bundle: true,
      platform: "node",
      target: "node24",
      format: "cjs",
      outfile: file,
      logLevel: "warning",
    });
  }
  return out;
}

interface Proc {
  pid: number;
  config: { cmd: string; args: string[]; envs: Record<string, string>; cwd?: string };
  tag?: string;
  child: ChildProcess | null;
  /** Subscribers (the Start stream, Connect streams) receiving enveloped events. */
  listeners: Set<(event: unknown) => void>;
  ended: boolean;
}

interface Box extends ContractSandbox {
  /** The template's size, as E2B reports it for the sandbox. */
  size: { cpuCount: number; memoryMB: number };
  /** The sandbox's setup cgroup on this machine (bw-exec's BW_EXEC_SETUP_CGROUP), if any. */
  cgroup: string | null;
  envdAccessToken: string;
  trafficAccessToken: string | null;
  startedAt: Date;
  endAt: Date;
  dir: string;
  procs: Map<number, Proc>;
}

/** Connect error codes and their HTTP statuses (connect protocol spec). */
const CONNECT_STATUS: Record<string, number> = {
  invalid_argument: 400,
  unauthenticated: 401,
  not_found: 404,
  failed_precondition: 400,
  unavailable: 503,
  unimplemented: 501,
};

class ConnectFailure extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolveBody, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => resolveBody(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

function envelope(flags: number, message: unknown): Buffer {
  const json = Buffer.from(JSON.stringify(message));
  const head = Buffer.alloc(5);
  head[0] = flags;
  head.writeUInt32BE(json.length, 1);
  return Buffer.concat([head, json]);
}

/** Splits the words of a command string as sh would, for quoted words only (shlex.quote output). */
export function splitWords(text: string): string[] {
  const words: string[] = [];
  let word: string | null = null;
  let i = 0;
  while (i < text.length) {
    const c = text[i] as string;
    if (c === " " || c === "\t" || c === "\n") {
      if (word !== null) words.push(word);
      word = null;
      i++;
    } else if (c === "'") {
      const close = text.indexOf("'", i + 1);
      if (close < 0) throw new Error("unterminated single quote");
      word = (word ?? "") + text.slice(i + 1, close);
      i = close + 1;
    } else if (c === '"') {
      let j = i + 1;
      let part = "";
      while (j < text.length && text[j] !== '"') {
        if (text[j] === "\\" && '"\\$`'.includes(text[j + 1] ?? "")) j++;
        else if ("$`".includes(text[j] as string)) throw new Error("expansion inside double quotes");
        part += text[j];
        j++;
      }
      if (j >= text.length) throw new Error("unterminated double quote");
      word = (word ?? "") + part;
      i = j + 1;
    } else if ("$`|;&<>()*?[]{}~#\\".includes(c)) {
      throw new Error(`shell syntax ${JSON.stringify(c)} is outside the contract model`);
    } else {
      word = (word ?? "") + c;
      i++;
    }
  }
  if (word !== null) words.push(word);
  return words;
}

const STAND_INS: Record<string, string> = {
  "bw-proxy": `#!/bin/sh\necho "bw-proxy stand-in"\nexec sleep 3600\n`,
  "bw-bridge": `#!/bin/sh\nprintf '{"event":"listening","standIn":true}\\n'\nexec sleep 3600\n`,
  // `bw-wiring reinstall` answers a ReinstallResult (its stdin is what the tests assert).
  "bw-wiring": `#!/bin/sh\ncat >/dev/null\nif [ "$1" = reinstall ]; then printf '{"ok":true,"hostsEntries":[]}\\n'; exit 0; fi\nprintf '{"ok":true,"standIn":true}\\n'\n`,
  "bw-proxy-view": `#!/bin/sh\nprintf '{}\\n'\n`,
};

export interface E2bServerOptions {
  apiKey: string;
  domain: string;
  templates: { proxy: string; work: string };
}

export async function startE2bServer(options: E2bServerOptions) {
  const work = mkdtempSync(join(tmpdir(), "bw-e2b-contract-"));
  const programs = await buildE2bPrograms(join(work, "programs"));
  const standIns = join(work, "bin");
  mkdirSync(standIns);
  const real = {
    "bw-unpack": `#!/bin/sh\nexec "${process.execPath}" "${programs.unpack}" "$@"\n`,
    "bw-collect": `#!/bin/sh\nexec "${process.execPath}" "${programs.collect}" "$@"\n`,
  };
  for (const [name, script] of Object.entries({ ...STAND_INS, ...real })) {
    writeFileSync(join(standIns, name), script);
    chmodSync(join(standIns, name), 0o755);
  }
  // Where each sandbox's setup cgroup goes: this machine's cgroup v2, if it lets us make one.
  const cgroupRoot = (() => {
    const mount = cgroup2Mount();
    if (mount === null) return null;
    const probe = join(mount, `bw-e2b-contract-${process.pid}`);
    try {
      mkdirSync(probe);
      rmdirSync(probe);
      return mount;
    } catch {
      return null;
    }
  })();
  const SIZES = new Map(E2B_TEMPLATES.map((t) => [t.key, { cpuCount: t.cpuCount, memoryMB: t.memoryMB }]));
  const boxes = new Map<string, Box>();
  const faults = new Map<string, E2bFaults>();
  const recorded: RecordedE2bRequest[] = [];
  let nextScriptedPid = 900_000;
  let origin = "";
  const templates = templateBuilds({
    seeded: [
      { name: options.templates.proxy, ...(SIZES.get("proxy") as { cpuCount: number; memoryMB: number }) },
      { name: options.templates.work, ...(SIZES.get("work") as { cpuCount: number; memoryMB: number }) },
    ],
    origin: () => origin,
  });
  const faultsOf = (box: Box) => faults.get(box.metadata["bw-run"] ?? "") ?? { runId: "" };

  // ---- processes ----

  /** Every pid a sandbox's processes have: envd's own children, the runner's supervisors and commands. */
  function sandboxPids(box: Box): number[] {
    const pids = new Set<number>();
    for (const p of box.procs.values()) if (p.child?.pid && !p.ended) pids.add(p.child.pid);
    for (const exec of recordedExecs(join(box.dir, "exec"))) {
      for (const pid of [exec.supervisor, exec.pid]) if (pid !== null) pids.add(pid);
    }
    return [...pids];
  }

  function signalSandbox(box: Box, signal: NodeJS.Signals): void {
    for (const pid of sandboxPids(box)) {
      for (const target of [-pid, pid]) {
        try {
          process.kill(target, signal);
        } catch {}
      }
    }
  }

  function emit(proc: Proc, event: unknown): void {
    for (const l of proc.listeners) l(event);
  }

  function end(proc: Proc, exitCode: number, status: string): void {
    if (proc.ended) return;
    proc.ended = true;
    emit(proc, { end: { exitCode, exited: true, status } });
    proc.listeners.clear();
  }

  function startProcess(box: Box, config: Proc["config"], user: string | null, stdin: boolean): Proc {
    const script = config.cmd === "/bin/bash" && config.args[0] === "-l" && config.args[1] === "-c";
    if (!script || config.args.length !== 3) {
      throw new ConnectFailure("invalid_argument", "the model runs `/bin/bash -l -c <command>` only");
    }
    let words: string[];
    try {
      words = splitWords(config.args[2] as string);
    } catch (e) {
      throw new ConnectFailure("invalid_argument", (e as Error).message);
    }
    const [program, ...args] = words;
    const proc: Proc = { pid: 0, config, child: null, listeners: new Set(), ended: false };
    const scripted = (code: number, output: string) => {
      proc.pid = nextScriptedPid++;
      setTimeout(() => {
        emit(proc, { data: { [code === 0 ? "stdout" : "stderr"]: Buffer.from(output).toString("base64") } });
        end(proc, code, `exit status ${code}`);
      }, 5);
      return proc;
    };
    const f = faultsOf(box);
    if (program === "bw-drop-root") {
      return register(box, scripted(0, "ok\n"));
    }
    if (program === "bw-check-user") {
      return register(box, scripted(f.checkUserFails ? 1 : 0, f.checkUserFails ? "user can sudo\n" : "ok\n"));
    }
    if (program === "bw-workdir") {
      return register(box, scripted(0, "ok\n"));
    }
    if (program === "bw-redirect") {
      return register(
        box,
        scripted(f.redirectFails ? 3 : 0, f.redirectFails ? "iptables: not found\n" : "ok\n"),
      );
    }
    if (program !== "bw-exec") {
      return register(box, scripted(127, `${program}: command not found (not in the contract model)\n`));
    }
    // The sweep is not this machine's to run (see the header): recorded, dropped.
    const runnerArgs = args[0] === "seal" ? args.filter((a) => a !== "--sweep") : args;
    const child = spawn(process.execPath, [programs.exec, ...runnerArgs], {
      cwd: box.dir,
      env: {
        PATH: `${standIns}:${process.env.PATH ?? "/usr/bin:/bin"}`,
        HOME: box.dir,
        ...config.envs,
        BW_EXEC_DIR: join(box.dir, "exec"),
        ...(box.cgroup ? { BW_EXEC_SETUP_CGROUP: box.cgroup } : {}),
        ...(user ? { USER: user } : {}),
      },
      stdio: ["pipe", "pipe", "pipe"],
    });
    proc.child = child;
    proc.pid = child.pid ?? nextScriptedPid++;
    child.stdin?.on("error", () => {});
    if (!stdin) child.stdin?.end();
    child.stdout?.on("data", (d: Buffer) => emit(proc, { data: { stdout: d.toString("base64") } }));
    child.stderr?.on("data", (d: Buffer) => emit(proc, { data: { stderr: d.toString("base64") } }));
    child.on("close", (code, signal) =>
      end(proc, code ?? -1, signal ? `signal: ${signal}` : `exit status ${code ?? -1}`),
    );
    return register(box, proc);
  }

  function register(box: Box, proc: Proc): Proc {
    box.procs.set(proc.pid, proc);
    return proc;
  }

  // ---- platform API ----

  // The answers are typed by the SDK's own OpenAPI-generated schemas: tsc holds them to the spec.
  function sandboxJson(box: Box): Schemas["Sandbox"] {
    return {
      clientID: "contract",
      envdVersion: ENVD_VERSION,
      sandboxID: box.sandboxID,
      templateID: box.templateID,
      alias: box.alias,
      domain: null,
      envdAccessToken: box.envdAccessToken,
      trafficAccessToken: box.trafficAccessToken,
    };
  }

  function listedJson(box: Box): Schemas["ListedSandbox"] {
    return {
      clientID: "contract",
      cpuCount: box.size.cpuCount,
      diskSizeMB: 1024,
      endAt: box.endAt.toISOString(),
      envdVersion: ENVD_VERSION,
      memoryMB: box.size.memoryMB,
      metadata: box.metadata,
      sandboxID: box.sandboxID,
      startedAt: box.startedAt.toISOString(),
      state: box.state,
      templateID: box.templateID,
      alias: box.alias,
    };
  }

  const NEW_SANDBOX_KEYS = new Set([
    "allow_internet_access",
    "autoPause",
    "autoPauseMemory",
    "autoResume",
    "envVars",
    "iam",
    "mcp",
    "metadata",
    "network",
    "templateID",
    "timeout",
    "volumeMounts",
  ]);
  const NETWORK_KEYS = new Set([
    "allowOut",
    "allowPublicTraffic",
    "denyOut",
    "egressProxy",
    "httpsPorts",
    "maskRequestHost",
    "rules",
  ]);
  const NETWORK_UPDATE_KEYS = new Set([
    "allow_internet_access",
    "allowOut",
    "denyOut",
    "egressProxy",
    "rules",
  ]);
  const CIDR = /^(?:[0-9]{1,3}\.){3}[0-9]{1,3}(?:\/[0-9]{1,2})?$/;

  function checkNetwork(network: unknown, keys: Set<string>): Record<string, unknown> {
    if (typeof network !== "object" || network === null || Array.isArray(network)) {
      throw new HttpError(400, "network must be an object");
    }
    for (const k of Object.keys(network))
      if (!keys.has(k)) throw new HttpError(400, `unknown network field ${k}`);
    const n = network as Record<string, unknown>;
    for (const list of ["allowOut", "denyOut"]) {
      if (
        n[list] !== undefined &&
        (!Array.isArray(n[list]) || !(n[list] as unknown[]).every((x) => typeof x === "string"))
      ) {
        throw new HttpError(400, `${list} must be a list of strings`);
      }
    }
    for (const d of (n.denyOut as string[] | undefined) ?? []) {
      if (!CIDR.test(d)) throw new HttpError(400, `denyOut takes CIDR blocks or IP addresses, not ${d}`);
    }
    return n;
  }

  function createSandbox(body: Record<string, unknown>): Box {
    for (const k of Object.keys(body))
      if (!NEW_SANDBOX_KEYS.has(k)) throw new HttpError(400, `unknown field ${k}`);
    if (typeof body.templateID !== "string") throw new HttpError(400, "templateID is required");
    const template = templates.resolve(body.templateID);
    if (!template) throw new HttpError(404, `template '${body.templateID}' not found`);
    const network = body.network === undefined ? null : checkNetwork(body.network, NETWORK_KEYS);
    const metadata = (body.metadata ?? {}) as Record<string, string>;
    const timeoutSeconds = typeof body.timeout === "number" ? body.timeout : 300;
    const id = id20();
    const dir = join(work, "sandboxes", id);
    mkdirSync(join(dir, "exec"), { recursive: true });
    const { cpuCount, memoryMB, ...named } = template;
    const box: Box = {
      sandboxID: id,
      ...named,
      size: { cpuCount, memoryMB },
      cgroup: cgroupRoot === null ? null : join(cgroupRoot, `bw-e2b-contract-${id}`),
      state: "running",
      metadata,
      envVars: (body.envVars ?? {}) as Record<string, string>,
      network,
      autoPause: body.autoPause === true,
      timeoutSeconds,
      pauses: 0,
      resumes: 0,
      envdAccessToken: `ea_${randomBytes(16).toString("hex")}`,
      trafficAccessToken:
        network?.allowPublicTraffic === false ? `ta_${randomBytes(16).toString("hex")}` : null,
      startedAt: new Date(),
      endAt: new Date(Date.now() + timeoutSeconds * 1000),
      dir,
      procs: new Map(),
    };
    if (faultsOf(box).dropNetworkOnCreate && box.network) {
      const { allowOut: _a, denyOut: _d, ...rest } = box.network;
      box.network = rest;
    }
    boxes.set(id, box);
    return box;
  }

  function mustBox(id: string): Box {
    const box = boxes.get(id);
    if (!box) throw new HttpError(404, `sandbox ${id} not found`);
    return box;
  }

  function killBox(box: Box): void {
    signalSandbox(box, "SIGCONT");
    signalSandbox(box, "SIGKILL");
    for (const p of box.procs.values()) end(p, -1, "signal: killed");
    boxes.delete(box.sandboxID);
    if (box.cgroup && existsSync(box.cgroup)) {
      try {
        writeFileSync(join(box.cgroup, "cgroup.kill"), "1");
        rmdirSync(box.cgroup);
      } catch {}
    }
    rmSync(box.dir, { recursive: true, force: true });
  }

  function platform(
    method: string,
    path: string,
    query: URLSearchParams,
    body: unknown,
  ): [number, unknown, Record<string, string>?] {
    const b = (body ?? {}) as Record<string, unknown>;
    const template = templates.handle(method, path, query, body);
    if (template) return [template[0], template[1]];
    if (method === "POST" && path === "/v2/sandboxes") return [201, sandboxJson(createSandbox(b))];
    if (method === "GET" && path === "/v2/sandboxes") {
      const wanted = new URLSearchParams(query.get("metadata") ?? "");
      const match: Array<[string, string]> = [...wanted].map(([k, v]) => [
        decodeURIComponent(k),
        decodeURIComponent(v),
      ]);
      const states = (query.get("state") ?? "").split(",").filter(Boolean);
      const all = [...boxes.values()]
        .filter((x) => match.every(([k, v]) => x.metadata[k] === v))
        .filter((x) => states.length === 0 || states.includes(x.state))
        .sort(
          (x, y) => y.startedAt.getTime() - x.startedAt.getTime() || (x.sandboxID < y.sandboxID ? -1 : 1),
        );
      const limit = Math.min(Number(query.get("limit") ?? PAGE_MAX) || PAGE_MAX, PAGE_MAX);
      const from = Number(query.get("nextToken") ?? 0) || 0;
      const page = all.slice(from, from + limit);
      const headers: Record<string, string> = {
        "x-total-running": String(all.filter((x) => x.state === "running").length),
      };
      if (from + limit < all.length) headers["x-next-token"] = String(from + limit);
      return [200, page.map(listedJson), headers];
    }
    const m = /^\/(v2\/)?sandboxes\/([a-z0-9]+)(\/[a-z]+)?$/.exec(path);
    if (!m) throw new HttpError(404, `no route ${method} ${path}`);
    const [, v2, id, tail = ""] = m as unknown as [string, string | undefined, string, string | undefined];
    const box = mustBox(id);
    const route = `${method} ${v2 ? "/v2" : ""}${tail}`;
    switch (route) {
      case "GET ": {
        const detail: Schemas["SandboxDetail"] = {
          ...listedJson(box),
          allowInternetAccess: null,
          domain: null,
          envdAccessToken: box.envdAccessToken,
          lifecycle: { autoResume: false, onTimeout: box.autoPause ? "pause" : "kill" },
          ...(box.network ? { network: box.network as Schemas["SandboxNetworkConfig"] } : {}),
        };
        return [200, detail];
      }
      case "DELETE ":
        killBox(box);
        return [204, null];
      case "POST /pause":
        if (box.state === "paused") throw new HttpError(409, `sandbox ${id} is already paused`);
        signalSandbox(box, "SIGSTOP");
        box.state = "paused";
        box.pauses++;
        return [204, null];
      case "POST /v2/connect": {
        const timeout = typeof b.timeout === "number" ? b.timeout : 300;
        const until = new Date(Date.now() + timeout * 1000);
        if (until > box.endAt) box.endAt = until; // TTL is only extended
        if (box.state === "running") return [200, sandboxJson(box)];
        box.state = "running";
        box.resumes++;
        signalSandbox(box, "SIGCONT");
        if (faultsOf(box).dropNetworkOnResume && box.network) {
          const { allowOut: _a, denyOut: _d, ...rest } = box.network;
          box.network = rest;
        }
        return [201, sandboxJson(box)];
      }
      case "POST /timeout":
        if (typeof b.timeout !== "number") throw new HttpError(400, "timeout is required");
        box.timeoutSeconds = b.timeout;
        box.endAt = new Date(Date.now() + b.timeout * 1000);
        return [204, null];
      case "PUT /network": {
        const update = checkNetwork(b, NETWORK_UPDATE_KEYS);
        if (box.state === "paused") throw new HttpError(409, `sandbox ${id} is paused`);
        if (faultsOf(box).ignoreNetworkUpdates) return [204, null];
        // The update replaces the egress configuration; what only create sets stays.
        const kept = Object.fromEntries(
          Object.entries(box.network ?? {}).filter(([k]) => !NETWORK_UPDATE_KEYS.has(k)),
        );
        const { allow_internet_access, ...egress } = update;
        box.network = {
          ...kept,
          ...egress,
          ...(allow_internet_access === false ? { denyOut: ["0.0.0.0/0"] } : {}),
        };
        return [204, null];
      }
      default:
        throw new HttpError(404, `no route ${method} ${path}`);
    }
  }

  // ---- envd ----

  /** A path of the files API on this machine: relative to the sandbox's home, never outside it. */
  function homePath(box: Box, path: string | null): string {
    if (!path) throw new HttpError(400, "path is required");
    const target = path.startsWith("/") ? resolve(path) : resolve(box.dir, path);
    const inside = relative(box.dir, target);
    if (inside === "" || inside.startsWith("..") || resolve(box.dir, inside) !== target) {
      throw new HttpError(
        400,
        `path '${path}' is outside the sandbox's home (the contract's filesystem model)`,
      );
    }
    return target;
  }

  /** The files of an upload: a raw body (octet-stream, the path in the query) or multipart parts. */
  function uploadedFiles(
    type: string,
    raw: Buffer,
    queryPath: string | null,
  ): Array<{ path: string; data: Buffer }> {
    if (type.startsWith("application/octet-stream")) {
      if (!queryPath)
        throw new HttpError(400, "the path query parameter is required for an octet-stream upload");
      return [{ path: queryPath, data: raw }];
    }
    const boundary = /^multipart\/form-data;.*boundary=("?)([^";]+)\1/i.exec(type)?.[2];
    if (!boundary)
      throw new HttpError(400, "the body is neither multipart/form-data nor application/octet-stream");
    const out: Array<{ path: string; data: Buffer }> = [];
    const delimiter = Buffer.from(`--${boundary}`);
    let at = raw.indexOf(delimiter);
    while (at !== -1) {
      const next = raw.indexOf(delimiter, at + delimiter.length);
      if (next === -1) break;
      const part = raw.subarray(at + delimiter.length + 2, next - 2); // CRLF after the delimiter and before the next
      const split = part.indexOf("\r\n\r\n");
      const head = part.subarray(0, split).toString();
      const name = /name="([^"]*)"/.exec(head)?.[1];
      const filename = /filename="([^"]*)"/.exec(head)?.[1];
      if (name === "file") out.push({ path: queryPath ?? filename ?? "", data: part.subarray(split + 4) });
      at = next;
    }
    if (out.length === 0) throw new HttpError(400, "no file part in the upload");
    return out;
  }

  function procOf(box: Box, selector: unknown): Proc {
    const pid = (selector as { pid?: number } | undefined)?.pid;
    const proc = pid === undefined ? undefined : box.procs.get(pid);
    if (!proc || proc.ended) throw new ConnectFailure("not_found", `process with pid ${pid} not found`);
    return proc;
  }

  function envdUnary(box: Box, method: string, body: Record<string, unknown>): unknown {
    switch (method) {
      case "List":
        return {
          processes: [...box.procs.values()]
            .filter((p) => !p.ended)
            .map((p) => ({ config: p.config, pid: p.pid, ...(p.tag ? { tag: p.tag } : {}) })),
        };
      case "SendInput": {
        const proc = procOf(box, (body.process as Record<string, unknown> | undefined) ?? undefined);
        const data = (body.input as { stdin?: string } | undefined)?.stdin;
        if (data === undefined) throw new ConnectFailure("invalid_argument", "stdin input only");
        proc.child?.stdin?.write(Buffer.from(data, "base64"));
        return {};
      }
      case "CloseStdin":
        procOf(box, body.process).child?.stdin?.end();
        return {};
      case "SendSignal": {
        const proc = procOf(box, body.process);
        const signal =
          body.signal === "SIGNAL_SIGTERM" ? "SIGTERM" : body.signal === "SIGNAL_SIGKILL" ? "SIGKILL" : null;
        if (signal === null) throw new ConnectFailure("invalid_argument", "SIGTERM or SIGKILL only");
        if (proc.child) proc.child.kill(signal);
        else end(proc, -1, `signal: ${signal === "SIGKILL" ? "killed" : "terminated"}`);
        return {};
      }
      default:
        throw new ConnectFailure("unimplemented", `process.Process/${method} is outside the contract model`);
    }
  }

  /** A streaming call: the start event, then the process's events as they come, then the end. */
  function envdStream(res: ServerResponse, proc: Proc): void {
    res.writeHead(200, { "content-type": "application/connect+json" });
    const send = (event: unknown) => res.write(envelope(0, { event }));
    send({ start: { pid: proc.pid } });
    const listener = (event: unknown) => {
      send(event);
      if ((event as { end?: unknown }).end) {
        proc.listeners.delete(listener);
        res.end(envelope(2, {}));
      }
    };
    proc.listeners.add(listener);
    res.on("close", () => proc.listeners.delete(listener));
  }

  // ---- the server ----

  const server = createServer(async (req, res) => {
    const url = new URL(req.url ?? "/", "http://contract");
    const raw = await readBody(req);
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(req.headers)) {
      if (["x-api-key", "x-access-token", "e2b-traffic-access-token"].includes(k)) continue;
      headers[k] = Array.isArray(v) ? v.join(", ") : (v ?? "");
    }
    const envdSandbox = req.headers["e2b-sandbox-id"];
    const api: RecordedE2bRequest["api"] = url.pathname.startsWith("/_contract/")
      ? "contract"
      : url.pathname.startsWith("/_storage/")
        ? "storage"
        : typeof envdSandbox === "string"
          ? "envd"
          : "platform";
    const streaming = (req.headers["content-type"] ?? "").startsWith("application/connect+json");
    let body: unknown = null;
    if (api === "storage" || (api === "envd" && url.pathname === "/files")) body = { bytes: raw.length };
    else
      try {
        const text =
          streaming && raw.length >= 5 ? raw.subarray(5, 5 + raw.readUInt32BE(1)).toString() : raw.toString();
        body = text ? JSON.parse(text) : null;
      } catch {
        body = raw.toString();
      }
    const basic = /^Basic (.+)$/.exec(req.headers.authorization ?? "")?.[1];
    const user = basic ? Buffer.from(basic, "base64").toString().replace(/:$/, "") : null;
    const record: RecordedE2bRequest = {
      seq: recorded.length + 1,
      api,
      method: req.method ?? "",
      path: url.pathname,
      query: Object.fromEntries(url.searchParams),
      sandboxId:
        typeof envdSandbox === "string"
          ? envdSandbox
          : (/\/sandboxes\/([a-z0-9]+)/.exec(url.pathname)?.[1] ?? null),
      user,
      apiKey:
        req.headers["x-api-key"] === undefined
          ? "absent"
          : req.headers["x-api-key"] === options.apiKey
            ? "ok"
            : "wrong",
      accessToken: "absent",
      headers,
      body,
      status: 0,
      deployment: null,
    };
    const json = (status: number, value: unknown, extra: Record<string, string> = {}) => {
      record.status = status;
      // An empty answer says so (as E2B's does): the SDK reads any other body as JSON.
      if (value === null)
        res.writeHead(status, status === 204 ? extra : { "content-length": "0", ...extra }).end();
      else res.writeHead(status, { "content-type": "application/json", ...extra }).end(JSON.stringify(value));
    };
    // Whose request it was (the deployment's metadata), so that test files running at once can
    // each look at their own: a created sandbox's, the sandbox's it is about, a list's filter.
    const meta =
      record.sandboxId !== null
        ? boxes.get(record.sandboxId)?.metadata
        : record.path === "/v2/sandboxes" && record.method === "POST"
          ? ((body as { metadata?: Record<string, string> } | null)?.metadata ?? undefined)
          : record.path === "/v2/sandboxes"
            ? Object.fromEntries(
                [...new URLSearchParams(url.searchParams.get("metadata") ?? "")].map(([k, v]) => [
                  decodeURIComponent(k),
                  decodeURIComponent(v),
                ]),
              )
            : undefined;
    record.deployment = meta?.["bw-deployment"] ?? null;
    if (api !== "contract") recorded.push(record);
    try {
      if (api === "contract") return contract(req.method ?? "", url, body, json);
      if (api === "storage") {
        return json(templates.upload(req.method ?? "", url.pathname, url.searchParams, headers, raw), null);
      }
      if (api === "platform") {
        if (record.apiKey !== "ok") throw new HttpError(401, "Invalid API key");
        const [status, value, extra] = platform(req.method ?? "", url.pathname, url.searchParams, body);
        return json(status, value, extra);
      }
      const box = boxes.get(envdSandbox as string);
      if (!box) return json(502, { code: 502, message: `The sandbox ${String(envdSandbox)} was not found` });
      const token = req.headers["x-access-token"];
      record.accessToken = token === undefined ? "absent" : token === box.envdAccessToken ? "ok" : "wrong";
      if (box.state === "paused")
        return json(502, { code: 502, message: `The sandbox ${box.sandboxID} is paused` });
      if (req.method === "GET" && url.pathname === "/health") return json(204, null);
      if (url.pathname === "/files") {
        if (record.accessToken !== "ok") return json(401, { code: 401, message: "invalid access token" });
        const fileUser = url.searchParams.get("username") ?? user ?? "user";
        if (fileUser !== "root" && fileUser !== "user") {
          return json(401, {
            code: 401,
            message: `error looking up user '${fileUser}': user: unknown user ${fileUser}`,
          });
        }
        if (req.method === "GET") {
          const path = homePath(box, url.searchParams.get("path"));
          if (!existsSync(path)) {
            return json(404, { code: 404, message: `path '${url.searchParams.get("path")}' does not exist` });
          }
          if (statSync(path).isDirectory()) {
            return json(400, { code: 400, message: `path '${url.searchParams.get("path")}' is a directory` });
          }
          const bytes = readFileSync(path);
          record.status = 200;
          res.writeHead(200, { "content-type": "application/octet-stream", "content-length": bytes.length });
          return res.end(bytes);
        }
        if (req.method === "POST") {
          const files = uploadedFiles(req.headers["content-type"] ?? "", raw, url.searchParams.get("path"));
          const written = files.map(({ path, data }) => {
            const target = homePath(box, path);
            mkdirSync(dirname(target), { recursive: true });
            writeFileSync(target, data);
            const home = fileUser === "root" ? "/root" : "/home/user";
            const shown = path.startsWith("/") ? path : `${home}/${path}`;
            return { name: shown.split("/").at(-1) ?? "", path: shown, type: "file" as const };
          });
          return json(200, written);
        }
        return json(405, { code: 405, message: `${req.method} /files is not in envd's API` });
      }
      const rpc = /^\/process\.Process\/([A-Za-z]+)$/.exec(url.pathname)?.[1];
      try {
        if (record.accessToken !== "ok") throw new ConnectFailure("unauthenticated", "invalid access token");
        if (!rpc) throw new ConnectFailure("unimplemented", `${url.pathname} is outside the contract model`);
        const b = (body ?? {}) as Record<string, unknown>;
        if (rpc === "Start" || rpc === "Connect") {
          const proc =
            rpc === "Start"
              ? startProcess(box, b.process as Proc["config"], user, b.stdin === true)
              : procOf(box, b.process);
          record.status = 200;
          return envdStream(res, proc);
        }
        return json(200, envdUnary(box, rpc, b));
      } catch (e) {
        if (!(e instanceof ConnectFailure)) throw e;
        if (streaming) {
          record.status = 200;
          res.writeHead(200, { "content-type": "application/connect+json" });
          return res.end(envelope(2, { error: { code: e.code, message: e.message } }));
        }
        return json(CONNECT_STATUS[e.code] ?? 500, { code: e.code, message: e.message });
      }
    } catch (e) {
      if (e instanceof HttpError) return json(e.status, { code: e.status, message: e.message });
      return json(500, { code: 500, message: (e as Error).message });
    }
  });

  function contract(
    method: string,
    url: URL,
    body: unknown,
    json: (status: number, value: unknown) => void,
  ): void {
    if (method === "GET" && url.pathname === "/_contract/requests") {
      const since = Number(url.searchParams.get("since") ?? 0);
      json(
        200,
        recorded.filter((r) => r.seq > since),
      );
      return;
    }
    if (method === "GET" && url.pathname === "/_contract/sandboxes") {
      json(
        200,
        [...boxes.values()].map(
          ({
            envdAccessToken: _e,
            trafficAccessToken: _t,
            dir,
            procs: _p,
            size: _z,
            cgroup: _c,
            startedAt: _s,
            endAt: _n,
            ...s
          }) => ({ ...s, home: dir }),
        ),
      );
      return;
    }
    if (method === "GET" && url.pathname === "/_contract/templates") {
      json(200, { builds: templates.builds(), layers: templates.layers() });
      return;
    }
    if (method === "POST" && url.pathname === "/_contract/build-faults") {
      templates.fault(body as E2bBuildFault);
      json(204, null);
      return;
    }
    if (method === "POST" && url.pathname === "/_contract/faults") {
      const f = body as E2bFaults;
      faults.set(f.runId, f);
      json(204, null);
      return;
    }
    json(404, { code: 404, message: "no such contract route" });
  }

  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const info: E2bContractInfo = {
    url: origin,
    apiKey: options.apiKey,
    domain: options.domain,
    templates: options.templates,
    cgroups: cgroupRoot !== null,
  };
  /** Kills every sandbox's processes and removes the state; synchronous, so it can run at exit. */
  const killAll = () => {
    for (const box of [...boxes.values()]) killBox(box);
    rmSync(work, { recursive: true, force: true });
  };
  return {
    info,
    killAll,
    async close() {
      killAll();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/**
 * The E2B contract server for the worker tests, provided to them as `e2b`. It closes with vitest,
 * killing every process a sandbox still runs (the runner's commands are detached: they would
 * outlive it), and kills them at exit too if vitest ends without closing.
 */
export async function startE2bContract(project: TestProject): Promise<void> {
  const server = await startE2bServer({
    apiKey: `e2b_${randomBytes(20).toString("hex")}`,
    domain: "e2b.contract.test",
    templates: { proxy: "benchwright-proxy", work: "benchwright-work" },
  });
  process.once("exit", server.killAll);
  project.vitest.onClose(() => server.close());
  project.provide("e2b", server.info);
}
