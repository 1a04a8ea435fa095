import { spawn } from "node:child_process";
import { chmodSync, mkdirSync, rmdirSync, writeFileSync } from "node:fs";
import type { ServerResponse } from "node:http";
import { join, resolve } from "node:path";
import { build } from "esbuild";
import { cgroup2Mount } from "../../proxy-image/src/exec-runner/exec-seal";
import { type Box, type E2bStore, type EnvdCall, emit, end, faultsOf, type Proc } from "./e2b-store";

// The E2B contract server's envd process API (e2b-envd.ts hands it the calls) and the process
// model behind it: what runs when the backend starts a command, on this machine. From envd's
// process.proto, Connect protocol with the JSON codec as `e2b` SDK 2.51.0 sends it:
//   process.Process/Start, /Connect  (server streaming, application/connect+json envelopes)
//   process.Process/List, /SendInput, /SendSignal, /CloseStdin  (unary, application/json)
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
//                    built here), and bw-layer (layer/main.ts), which reads <sandbox dir>/sandbox
//                    where it is asked for /home/sandbox (the working directory). `bw-exec seal` runs for real too, on a cgroup of the sandbox's
//                    own under this machine's cgroup v2 (BW_EXEC_SETUP_CGROUP, when there is one),
//                    but without --sweep, which is recorded and dropped: the sweep takes every
//                    process started since the first setup command, on this machine that is not
//                    the sandbox's alone (the sweep is tested in test/unit/exec-seal.test.ts).
//   bw-drop-root,    the work template's setup scripts, scripted: exit 0 and print "ok", unless
//   bw-check-user,   a fault for the sandbox's run says otherwise (bw-drop-root and bw-workdir
//   bw-redirect,     never fail).
//   bw-workdir
//   anything else    exit 127.
// Every process runs as this machine's test user: the envd `user` is recorded, not enforced.

export async function buildE2bPrograms(
  outDir: string,
): Promise<{ exec: string; bridge: string; unpack: string; collect: string; layer: string }> {
  const root = resolve(import.meta.dirname, "../..");
  const out = {
    exec: join(outDir, "exec.cjs"),
    bridge: join(outDir, "e2b-bridge.cjs"),
    unpack: join(outDir, "unpack.cjs"),
    collect: join(outDir, "collect.cjs"),
    layer: join(outDir, "layer.cjs"),
  };
  for (const [entry, file] of [
    ["proxy-image/src/exec-runner/main.ts", out.exec],
    ["proxy-image/src/e2b-bridge/main.ts", out.bridge],
    ["proxy-image/src/unpack/main.ts", out.unpack],
    ["proxy-image/src/collect/main.ts", out.collect],
    ["proxy-image/src/layer/main.ts", out.layer],
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

/** What the runner needs on this machine: bw-exec built, the programs it runs on PATH. */
export interface Runner {
  /** The built bw-exec (proxy-image/src/exec-runner/main.ts). */
  exec: string;
  /** The directory of the stand-ins and the real bw-unpack, bw-collect: first on PATH. */
  standIns: string;
  /** Where each sandbox's setup cgroup goes: this machine's cgroup v2, if it lets us make one. */
  cgroupRoot: string | null;
}

/** Builds the real programs into the server's directory and writes the stand-ins beside them. */
export async function installRunner(work: string): Promise<Runner> {
  const programs = await buildE2bPrograms(join(work, "programs"));
  const standIns = join(work, "bin");
  mkdirSync(standIns);
  const real = {
    "bw-unpack": `#!/bin/sh\nexec "${process.execPath}" "${programs.unpack}" "$@"\n`,
    "bw-collect": `#!/bin/sh\nexec "${process.execPath}" "${programs.collect}" "$@"\n`,
    // This machine has no /home/sandbox: the sandbox's own directory stands for it.
    "bw-layer": `#!/bin/sh\nd="$1"; shift; [ "$d" = /home/sandbox ] && d="$HOME/sandbox"\nexec "${process.execPath}" "${programs.layer}" "$d" "$@"\n`,
  };
  for (const [name, script] of Object.entries({ ...STAND_INS, ...real })) {
    writeFileSync(join(standIns, name), script);
    chmodSync(join(standIns, name), 0o755);
  }
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
  return { exec: programs.exec, standIns, cgroupRoot };
}

/** The process API of every sandbox of one server: answers a `/process.Process/<method>` call. */
export function processService(store: E2bStore, runner: Runner): (call: EnvdCall, box: Box) => void {
  let nextScriptedPid = 900_000;

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
    const f = faultsOf(store, box);
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
    const child = spawn(process.execPath, [runner.exec, ...runnerArgs], {
      cwd: box.dir,
      env: {
        PATH: `${runner.standIns}:${process.env.PATH ?? "/usr/bin:/bin"}`,
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

  return (call, box) => {
    const { url, body, record, json, res } = call;
    const rpc = /^\/process\.Process\/([A-Za-z]+)$/.exec(url.pathname)?.[1];
    try {
      if (record.accessToken !== "ok") throw new ConnectFailure("unauthenticated", "invalid access token");
      if (!rpc) throw new ConnectFailure("unimplemented", `${url.pathname} is outside the contract model`);
      const b = (body ?? {}) as Record<string, unknown>;
      if (rpc === "Start" || rpc === "Connect") {
        const proc =
          rpc === "Start"
            ? startProcess(box, b.process as Proc["config"], call.user, b.stdin === true)
            : procOf(box, b.process);
        record.status = 200;
        return envdStream(res, proc);
      }
      return json(200, envdUnary(box, rpc, b));
    } catch (e) {
      if (!(e instanceof ConnectFailure)) throw e;
      if (call.streaming) {
        record.status = 200;
        res.writeHead(200, { "content-type": "application/connect+json" });
        return res.end(envelope(2, { error: { code: e.code, message: e.message } }));
      }
      return json(CONNECT_STATUS[e.code] ?? 500, { code: e.code, message: e.message });
    }
  };
}
