import type { ChildProcess } from "node:child_process";
import type { Readable } from "node:stream";
import { UNPACK_EXIT, UnpackResult } from "@benchwright/shared/contract/bundle";
import { AgentError } from "./errors";
import { IMAGE_MOUNT, NODE_MOUNT } from "./sandbox";
import { programIn, type WorkSandbox } from "./sandbox-record";

// Bundles in and artifacts out: the image's bw-unpack and bw-collect run in a sandbox as the
// execute stage's uid, their stdin or stdout streamed to the agent's caller. The programs check
// every entry themselves (shared/archive); the agent only bounds the bytes and the time.

/** How long an unpack or a collect may take before it is killed. */
const TRANSFER_TIMEOUT_MS = 10 * 60_000;
const MAX_STDERR = 16 * 1024;

export interface SandboxProgram {
  /** Starts argv in the sandbox (execute stage, a cgroup leaf of its own), stdio piped. */
  spawn(argv: readonly string[]): { child: ChildProcess; done: () => void };
}

function collectStderr(child: ChildProcess): () => string {
  let text = "";
  child.stderr?.on("data", (d: Buffer) => {
    if (text.length < MAX_STDERR) text += d.toString();
  });
  return () => text.trim().split("\n").slice(-3).join("; ");
}

function exited(child: ChildProcess): Promise<{ code: number | null; signal: string | null }> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) {
      resolve({ code: child.exitCode, signal: child.signalCode });
      return;
    }
    child.once("close", (code, signal) => resolve({ code, signal }));
    child.once("error", () => resolve({ code: null, signal: null }));
  });
}

/**
 * Streams `body` (a .tar.gz, at most `maxUploadBytes`) into bw-unpack. The program's answer:
 * `{ok: true, ...}` (exit 0) or `{ok: false, code, message}` (exit 2, refused).
 */
async function runUnpack(
  program: SandboxProgram,
  argv: readonly string[],
  body: Readable,
  maxUploadBytes: number,
): Promise<UnpackResult> {
  const { child, done } = program.spawn(argv);
  const stderr = collectStderr(child);
  let stdout = "";
  child.stdout?.on("data", (d: Buffer) => {
    if (stdout.length < 65_536) stdout += d.toString();
  });
  const timer = setTimeout(() => child.kill("SIGKILL"), TRANSFER_TIMEOUT_MS);
  let received = 0;
  let tooLarge = false;
  child.stdin?.on("error", () => {});
  body.on("data", (chunk: Buffer) => {
    received += chunk.length;
    if (received > maxUploadBytes && !tooLarge) {
      tooLarge = true;
      body.unpipe(child.stdin ?? undefined);
      child.stdin?.destroy();
      child.kill("SIGKILL");
    }
  });
  if (child.stdin) body.pipe(child.stdin);
  const end = await exited(child);
  clearTimeout(timer);
  done();
  body.resume();
  if (tooLarge) throw new AgentError("invalid_request", `the bundle is larger than ${maxUploadBytes} bytes`);
  let parsed: UnpackResult | null = null;
  try {
    parsed = UnpackResult.parse(JSON.parse(stdout.trim().split("\n").at(-1) ?? ""));
  } catch {}
  if (parsed && end.code === (parsed.ok ? UNPACK_EXIT.ok : UNPACK_EXIT.refused)) return parsed;
  throw new AgentError(
    "sandbox_failed",
    `bw-unpack ended with ${end.signal ?? `exit ${end.code}`} and no answer${stderr() ? `: ${stderr()}` : ""}`,
  );
}

/**
 * Starts bw-collect and resolves once it has written its first byte (the archive follows on the
 * returned stream) or failed before any (a sandbox_failed with its stderr). A failure after the
 * first byte aborts the stream, so a caller never takes a cut archive for a whole one.
 */
async function runCollect(
  program: SandboxProgram,
  argv: readonly string[],
): Promise<{ stream: Readable; abort: () => void }> {
  const { child, done } = program.spawn(argv);
  const stderr = collectStderr(child);
  child.stdin?.end();
  const timer = setTimeout(() => child.kill("SIGKILL"), TRANSFER_TIMEOUT_MS);
  const stdout = child.stdout as Readable;
  const end = exited(child).then((r) => {
    clearTimeout(timer);
    done();
    return r;
  });
  const first = await Promise.race([
    new Promise<"data">((resolve) => stdout.once("readable", () => resolve("data"))),
    end.then(() => "exit" as const),
  ]);
  if (first === "exit" && stdout.readableLength === 0) {
    const r = await end;
    throw new AgentError(
      "sandbox_failed",
      `bw-collect ended with ${r.signal ?? `exit ${r.code}`} and no archive${stderr() ? `: ${stderr()}` : ""}`,
    );
  }
  void end.then((r) => {
    if (r.code !== 0) stdout.destroy(new Error(`bw-collect ended with ${r.signal ?? `exit ${r.code}`}`));
  });
  return { stream: stdout, abort: () => child.kill("SIGKILL") };
}

const programArgv = (program: string, dir: string, bounds: { maxBytes: number; maxFiles: number }) => [
  NODE_MOUNT,
  `${IMAGE_MOUNT}/${program}`,
  dir,
  "--max-bytes",
  String(bounds.maxBytes),
  "--max-files",
  String(bounds.maxFiles),
];

/** bw-unpack (the execute stage's uid) into `dir`, the body streamed to it. */
export function unpackBundle(
  sandbox: WorkSandbox,
  dir: string,
  body: Readable,
  bounds: { maxBytes: number; maxFiles: number; maxUploadBytes: number },
): Promise<UnpackResult> {
  return runUnpack(
    programIn(sandbox, "unpack"),
    programArgv("unpack.cjs", dir, bounds),
    body,
    bounds.maxUploadBytes,
  );
}

/** bw-collect (the execute stage's uid) of `dir`: the archive, streamed. */
export function collectArtifacts(
  sandbox: WorkSandbox,
  dir: string,
  bounds: { maxBytes: number; maxFiles: number },
): Promise<{ stream: Readable; abort: () => void }> {
  return runCollect(programIn(sandbox, "collect"), programArgv("collect.cjs", dir, bounds));
}
