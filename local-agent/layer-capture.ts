import { type ChildProcess, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { createReadStream, createWriteStream, mkdirSync } from "node:fs";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { captureLayer, LayerRefusal, overlayForm } from "@benchwright/shared/archive/layer";
import type { CapturedImage } from "@benchwright/shared/contract/setup-image";
import { BASE_ENV } from "./command";
import { AgentError, message } from "./errors";
import type { LayerStore } from "./layers";
import { ROOTFS_UID_BASE, ROOTFS_UID_COUNT } from "./rootfs";
import type { Sandbox } from "./sandbox-record";

// Keeping a sealed builder's filesystem changes as a setup layer (docs/local-backend.md, "Setup
// layers"). Host GNU tar reads the overlay's upper directory and the builder's /home (both on the
// layer tmpfs the agent mounted beside the sandbox), never following a link; the transform
// (shared/archive/layer.ts) makes the canonical layer, hashed and counted as it is written; a
// second pass gives GNU tar the layer in overlay form to extract as a lower layer's root. Nothing
// of the sandbox runs meanwhile (the caller checked it is sealed and ran no command, and refuses
// execs while this reads).

/** GNU tar reading `dir` as the transform expects it: pax, numeric owners, overlay xattrs, no -h. */
function readTree(dir: string): {
  child: ChildProcess;
  tar: ReadableStream<Uint8Array>;
  done: Promise<void>;
} {
  const child = spawn(
    "tar",
    [
      "-c",
      "-f",
      "-",
      "--format=pax",
      "--numeric-owner",
      "--xattrs",
      // All of the overlay's: the transform keeps opaque and refuses metacopy and redirect.
      "--xattrs-include=trusted.overlay.*",
      "--sort=name",
      "--one-file-system",
      "-C",
      dir,
      ".",
    ],
    { env: BASE_ENV, stdio: ["ignore", "pipe", "pipe"] },
  );
  const done = exited(child, `reading ${dir}`);
  // Awaited once the layer is written; a refused capture kills the reader and never asks.
  done.catch(() => {});
  return { child, tar: Readable.toWeb(child.stdout) as ReadableStream<Uint8Array>, done };
}

function exited(child: ChildProcess, what: string): Promise<void> {
  let stderr = "";
  child.stderr?.on("data", (d: Buffer) => {
    if (stderr.length < 4096) stderr += d.toString();
  });
  return new Promise((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code) => {
      if (code === 0) resolve();
      else
        reject(
          new Error(`tar ${what}: ${stderr.trim().split("\n").slice(0, 2).join("; ") || `exit ${code}`}`),
        );
    });
  });
}

/**
 * Captures `sandbox` (a sealed builder that ran no command) into the store: its digest, size and
 * entry count. Over `maxBytes` → setup_image_too_large; changes a layer cannot keep or one run's
 * CA in a file → the transform's refusal code. Nothing is kept of a refused capture.
 */
export async function captureSandbox(
  store: LayerStore,
  sandbox: Sandbox,
  maxBytes: number,
): Promise<CapturedImage> {
  const trees = sandbox.process.captureTrees;
  if (!trees) throw new AgentError("capture_too_late", `sandbox ${sandbox.id} was not made with capture`);
  const tmp = store.scratch();
  const readers = [readTree(trees.upper), readTree(trees.home)];
  try {
    const made = captureLayer(
      [
        { at: "", tar: (readers[0] as (typeof readers)[0]).tar },
        { at: "home", tar: (readers[1] as (typeof readers)[1]).tar },
      ],
      {
        executeUid: sandbox.process.uid + 1,
        uidBase: ROOTFS_UID_BASE,
        uidCount: ROOTFS_UID_COUNT,
        runCaPem: sandbox.caCertPem,
      },
    );
    const hash = createHash("sha256");
    let bytes = 0;
    const file = join(tmp, "layer.tar");
    const out = createWriteStream(file, { mode: 0o600 });
    const written = new Promise<void>((resolve, reject) => {
      out.on("finish", resolve);
      out.on("error", reject);
    });
    const reader = made.layer.getReader();
    try {
      for (let next = await reader.read(); !next.done; next = await reader.read()) {
        bytes += next.value.length;
        if (bytes > maxBytes) {
          throw new AgentError(
            "setup_image_too_large",
            `the setup layer is larger than the bound of ${maxBytes} bytes`,
          );
        }
        hash.update(next.value);
        if (!out.write(next.value)) await new Promise<void>((r) => out.once("drain", () => r()));
      }
    } catch (error) {
      await reader.cancel().catch(() => {});
      throw error;
    } finally {
      out.end();
    }
    await written;
    await Promise.all(readers.map((r) => r.done));
    const digest = `sha256:${hash.digest("hex")}`;
    await unpackOverlayForm(file, join(tmp, "root"));
    store.keep(tmp, digest);
    return { digest, bytes, files: made.files() };
  } catch (error) {
    for (const r of readers) r.child.kill("SIGKILL");
    store.discard(tmp);
    if (error instanceof AgentError) throw error;
    if (error instanceof LayerRefusal) throw new AgentError(error.code, error.message);
    throw new AgentError("sandbox_failed", `could not capture sandbox ${sandbox.id}: ${message(error)}`);
  }
}

/**
 * The layer extracted as an overlay lower layer's root: GNU tar makes the whiteouts (devices 0:0)
 * and the opaque xattrs Node cannot, with the owners the transform gave (base+k).
 */
async function unpackOverlayForm(layerTar: string, root: string): Promise<void> {
  mkdirSync(root, { mode: 0o755 });
  const child = spawn(
    "tar",
    [
      "-x",
      "-f",
      "-",
      "--numeric-owner",
      "-p",
      "--xattrs",
      "--xattrs-include=trusted.overlay.opaque",
      "-C",
      root,
    ],
    { env: BASE_ENV, stdio: ["pipe", "ignore", "pipe"] },
  );
  const done = exited(child, "extracting the layer");
  const source = overlayForm(
    Readable.toWeb(createReadStream(layerTar)) as ReadableStream<Uint8Array>,
    ROOTFS_UID_BASE,
  );
  await Promise.all([source.pipeTo(Writable.toWeb(child.stdin as NonNullable<typeof child.stdin>)), done]);
}
