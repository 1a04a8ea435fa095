import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { captureLayer, LayerRefusal } from "@benchwright/shared/archive/layer";
import { packTar, type TarEntry, unpackTar } from "modern-tar";
import { afterEach, describe, expect, it } from "vitest";
import { LayerStop, packLayer } from "../../proxy-image/src/layer/layer";

// bw-layer (sandbox0's capture: a pod's working directory as a tar) on a real directory, read
// through the capture rules as the sandbox0 backend reads it, and the rules against tars a pod
// could send instead of bw-layer's (nothing it sends is trusted).

const POD_RULES = { executeUid: null, uidBase: 0, uidCount: 65_536, runCaPem: null };
const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

async function tarOfDir(dir: string, limits = { maxBytes: 1 << 20, maxFiles: 100 }) {
  const chunks: Uint8Array[] = [];
  const out = new WritableStream<Uint8Array>({ write: (c) => void chunks.push(c) });
  const counted = await packLayer(dir, limits, out);
  return { tar: new Uint8Array(Buffer.concat(chunks)), counted };
}

async function layerOf(tar: Uint8Array) {
  const made = captureLayer([{ at: "home/sandbox", tar: new Blob([tar]).stream() }], POD_RULES);
  return unpackTar(new Uint8Array(await new Response(made.layer).arrayBuffer()));
}

describe("bw-layer", () => {
  it("packs the working directory but out/, and the rules keep it under home/sandbox, opaque", async () => {
    const dir = mkdtempSync(join(tmpdir(), "bw-layer-"));
    dirs.push(dir);
    mkdirSync(join(dir, ".venv/bin"), { recursive: true });
    writeFileSync(join(dir, ".venv/bin/tool"), "installed");
    chmodSync(join(dir, ".venv/bin/tool"), 0o4755);
    symlinkSync("/usr/bin/python3", join(dir, ".venv/bin/python"));
    mkdirSync(join(dir, "out"));
    writeFileSync(join(dir, "out/result.txt"), "one run's");
    const { tar, counted } = await tarOfDir(dir);
    expect(counted).toEqual({ files: 5, bytes: 9 });
    const entries = await layerOf(tar);
    expect(entries.map((e) => e.header.name)).toEqual([
      "home/sandbox/",
      "home/sandbox/.wh..wh..opq",
      "home/sandbox/.venv/",
      "home/sandbox/.venv/bin/",
      "home/sandbox/.venv/bin/python",
      "home/sandbox/.venv/bin/tool",
    ]);
    const tool = entries.find((e) => e.header.name.endsWith("tool"));
    expect(tool?.header.mode).toBe(0o755);
    expect(new TextDecoder().decode(tool?.data)).toBe("installed");
    expect(entries.find((e) => e.header.name.endsWith("python"))?.header.linkname).toBe("/usr/bin/python3");
    // The same directory, the same tar.
    expect((await tarOfDir(dir)).tar).toEqual(tar);
  });

  it("stops past its bounds", async () => {
    const dir = mkdtempSync(join(tmpdir(), "bw-layer-"));
    dirs.push(dir);
    writeFileSync(join(dir, "big"), "x".repeat(100));
    const stop = await tarOfDir(dir, { maxBytes: 99, maxFiles: 100 }).catch((e: unknown) => e);
    expect(stop).toBeInstanceOf(LayerStop);
    expect((stop as LayerStop).why).toBe("too_large");
  });

  it("the rules refuse a tar no tree walk makes: through a symlink, .., a name twice", async () => {
    const file = (name: string): TarEntry => ({ header: { name, size: 1, type: "file" }, body: "x" });
    const link: TarEntry = { header: { name: "./etc", type: "symlink", size: 0, linkname: "/etc" } };
    for (const entries of [
      [link, file("./etc/passwd")],
      [file("./../../bin/sh")],
      [file("./a"), file("./a")],
    ]) {
      const tar = await packTar([{ header: { name: "./", type: "directory", size: 0 } }, ...entries]);
      const refused = await layerOf(tar).catch((e: unknown) => e);
      expect(refused, JSON.stringify(entries.map((e) => e.header.name))).toBeInstanceOf(LayerRefusal);
      expect((refused as LayerRefusal).code).toBe("setup_image_unsupported");
    }
  });
});
