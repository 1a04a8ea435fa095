import { captureLayer, LayerRefusal, layerExcluded, overlayForm } from "@benchwright/shared/archive/layer";
import { LAYER_EXCLUDED } from "@benchwright/shared/contract/setup-image";
import { packTar, type TarEntry, type TarHeader, unpackTar } from "modern-tar";
import { beforeAll, describe, expect, it } from "vitest";
import { SEAL_OWNED } from "../../local-agent/wiring-files";
import { createTestCa } from "../../scripts/lib/test-ca";

// The capture's rules (shared/archive/layer.ts), each on archives made here the way GNU tar
// reads an overlay's upper directory: what a layer never keeps (case P4), whiteouts and opaque
// directories, owners, setuid bits and xattrs, hardlinks, and the run CA's body.

const BASE = 1_000_000_000;
const EXEC = 200_001;
const rules = { executeUid: EXEC, uidBase: BASE, uidCount: 65_536, runCaPem: null as string | null };

type In = Partial<TarHeader> & { name: string; body?: string; device?: [number, number] };

const dir = (name: string, extra: Partial<TarHeader> = {}): In => ({
  name: `./${name}/`,
  type: "directory",
  uid: BASE,
  gid: BASE,
  mode: 0o755,
  ...extra,
});
const file = (name: string, body = "x", extra: Partial<TarHeader> = {}): In => ({
  name: `./${name}`,
  body,
  uid: BASE,
  gid: BASE,
  mode: 0o644,
  ...extra,
});

/** A tar as GNU tar writes one of a tree (`./` first), device numbers patched into the headers. */
async function tarOf(entries: In[]): Promise<Uint8Array> {
  const all: In[] = [{ name: "./", type: "directory", uid: BASE, gid: BASE, mode: 0o755 }, ...entries];
  const tar = await packTar(
    all.map(
      ({ body, device, ...header }): TarEntry => ({
        header: { size: body === undefined ? 0 : Buffer.byteLength(body), ...header },
        body,
      }),
    ),
  );
  // modern-tar writes 0:0; GNU tar writes the real numbers at 329 and 337.
  for (const e of all.filter((e) => e.device)) {
    const at = findHeader(tar, e.name);
    const [major, minor] = e.device as [number, number];
    tar.set(
      Buffer.from(`${major.toString(8).padStart(7, "0")}\0${minor.toString(8).padStart(7, "0")}\0`),
      at + 329,
    );
    tar.set(Buffer.from("        "), at + 148);
    const sum = tar.subarray(at, at + 512).reduce((n, b) => n + b, 0);
    tar.set(Buffer.from(`${sum.toString(8).padStart(6, "0")}\0 `), at + 148);
  }
  return tar;
}

function findHeader(tar: Uint8Array, name: string): number {
  for (let at = 0; at < tar.length; at += 512) {
    if (
      Buffer.from(tar.subarray(at, at + 100))
        .toString()
        .replace(/\0.*$/s, "") === name
    )
      return at;
  }
  throw new Error(`no header ${name}`);
}

const stream = (bytes: Uint8Array) => new Blob([bytes]).stream();

async function capture(trees: Array<{ at: string; entries: In[] }>, r = rules) {
  const made = captureLayer(
    await Promise.all(trees.map(async (t) => ({ at: t.at, tar: stream(await tarOf(t.entries)) }))),
    r,
  );
  const bytes = new Uint8Array(await new Response(made.layer).arrayBuffer());
  return { entries: await unpackTar(bytes), files: made.files(), bytes };
}

async function refusal(trees: Array<{ at: string; entries: In[] }>, r = rules): Promise<LayerRefusal> {
  const error = await capture(trees, r).then(
    () => null,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(LayerRefusal);
  return error as LayerRefusal;
}

const names = (entries: Array<{ header: TarHeader }>) => entries.map((e) => e.header.name);

describe("setup layer capture (shared/archive/layer.ts)", () => {
  let caPem: string;
  beforeAll(async () => {
    caPem = (await createTestCa("Benchwright layer test run CA")).certPem;
  });

  it("case P4: every path the seal owns is one a layer never keeps", () => {
    for (const { path } of SEAL_OWNED) expect(layerExcluded(path), path).toBe(true);
    expect(layerExcluded("run/benchwright/run-ca.pem")).toBe(true);
    expect(layerExcluded("home/sandbox/out")).toBe(true);
    expect(layerExcluded("home/sandbox/output")).toBe(false);
    expect(layerExcluded("etc/hosts.allow")).toBe(false);
    expect(LAYER_EXCLUDED).toContain("tmp/");
  });

  it("case P4: one run's files, scratch space and the kernel's trees are left out", async () => {
    const { entries } = await capture([
      {
        at: "",
        entries: [
          dir("etc"),
          file("etc/hosts"),
          file("etc/resolv.conf"),
          file("etc/nsswitch.conf"),
          dir("etc/ssl"),
          dir("etc/ssl/certs"),
          file("etc/ssl/certs/ca-certificates.crt"),
          dir("run"),
          dir("run/benchwright"),
          file("run/benchwright/run-ca.pem"),
          dir("tmp"),
          file("tmp/x"),
          dir("var"),
          dir("var/tmp"),
          file("var/tmp/x"),
          dir("dev"),
          dir("dev/shm"),
          file("dev/shm/x"),
          dir("usr"),
          file("usr/tool", "tool"),
        ],
      },
      {
        at: "home",
        entries: [dir("sandbox", { uid: EXEC, gid: EXEC }), dir("sandbox/out"), file("sandbox/out/result")],
      },
    ]);
    expect(names(entries)).toEqual([
      "etc/",
      "etc/ssl/",
      "etc/ssl/certs/",
      "var/",
      "usr/",
      "usr/tool",
      "home/",
      "home/sandbox/",
    ]);
  });

  it("turns overlay whiteouts and opaque directories into the layer's, and drops other devices and fifos", async () => {
    const { entries } = await capture([
      {
        at: "",
        entries: [
          dir("usr"),
          { name: "./usr/gone", type: "character-device", uid: 0, gid: 0, mode: 0, size: 0, device: [0, 0] },
          { name: "./usr/null", type: "character-device", uid: BASE, gid: BASE, size: 0, device: [1, 3] },
          { name: "./usr/disk", type: "block-device", uid: BASE, gid: BASE, size: 0, device: [8, 0] },
          { name: "./usr/pipe", type: "fifo", uid: BASE, gid: BASE, size: 0 },
          dir("opt", { pax: { "SCHILY.xattr.trusted.overlay.opaque": "y" } }),
          file("opt/new"),
        ],
      },
    ]);
    expect(names(entries)).toEqual(["usr/", "usr/.wh.gone", "opt/", "opt/.wh..wh..opq", "opt/new"]);
  });

  it("maps owners: the execute uid to 1 (under home/ only), image uid base+k to k; refuses any other", async () => {
    const { entries } = await capture([
      { at: "", entries: [dir("srv", { uid: BASE + 5, gid: BASE + 7 })] },
      {
        at: "home",
        entries: [
          dir("sandbox", { uid: EXEC, gid: EXEC }),
          file("sandbox/venv", "v", { uid: EXEC, gid: BASE }),
        ],
      },
    ]);
    expect(entries.map((e) => [e.header.name, e.header.uid, e.header.gid])).toEqual([
      ["srv/", 5, 7],
      ["home/", 0, 0],
      ["home/sandbox/", 1, 1],
      ["home/sandbox/venv", 1, 0],
    ]);
    const host = await refusal([{ at: "", entries: [file("opt/host", "x", { uid: 0 })] }]);
    expect(host).toMatchObject({ code: "setup_image_unsupported", message: expect.stringMatching(/owner/) });
    const outside = await refusal([{ at: "", entries: [file("opt/mine", "x", { uid: EXEC, gid: EXEC })] }]);
    expect(outside).toMatchObject({
      code: "setup_image_unsupported",
      message: expect.stringMatching(/outside \/home/),
    });
  });

  it("clears setuid and setgid bits and drops every xattr but opaque; refuses metacopy and redirect", async () => {
    const { entries } = await capture([
      {
        at: "",
        entries: [
          file("bin-sh", "#!", { mode: 0o6755, pax: { "SCHILY.xattr.security.capability": "\u0001" } }),
          dir("shared", { mode: 0o1777, pax: { "SCHILY.xattr.user.note": "x" } }),
        ],
      },
    ]);
    expect(entries.map((e) => [e.header.name, e.header.mode])).toEqual([
      ["bin-sh", 0o755],
      ["shared/", 0o1777],
    ]);
    for (const e of entries)
      expect(Object.keys(e.header.pax ?? {}).filter((k) => k.includes("xattr"))).toEqual([]);
    for (const x of ["metacopy", "redirect"]) {
      const refused = await refusal([
        { at: "", entries: [file("f", "", { pax: { [`SCHILY.xattr.trusted.overlay.${x}`]: "y" } })] },
      ]);
      expect(refused.code).toBe("setup_image_unsupported");
    }
  });

  it("keeps a hardlink only to a kept file, and refuses a name layers reserve", async () => {
    const { entries } = await capture([
      {
        at: "",
        entries: [
          dir("etc"),
          file("etc/hosts"),
          file("etc/kept", "k"),
          { name: "./etc/alias", type: "link", linkname: "./etc/kept", uid: BASE, gid: BASE, size: 0 },
          { name: "./etc/hosts2", type: "link", linkname: "./etc/hosts", uid: BASE, gid: BASE, size: 0 },
        ],
      },
    ]);
    expect(entries.map((e) => [e.header.name, e.header.type, e.header.linkname || null])).toEqual([
      ["etc/", "directory", null],
      ["etc/kept", "file", null],
      ["etc/alias", "link", "etc/kept"],
    ]);
    expect((await refusal([{ at: "", entries: [file(".wh.usr")] }])).code).toBe("setup_image_unsupported");
  });

  it("case P4: refuses a file holding the run CA's body, however it is wrapped", async () => {
    const body = caPem.replace(/-----[^-]+-----/g, "").replace(/\s+/g, "");
    const rewrapped = `junk before\n${body.match(/.{1,76}/g)?.join("\r\n")}\n`;
    const withCa = { ...rules, runCaPem: caPem };
    for (const content of [caPem, rewrapped]) {
      const refused = await refusal(
        [{ at: "", entries: [dir("usr"), file("usr/copy.pem", content)] }],
        withCa,
      );
      expect(refused).toMatchObject({
        code: "setup_image_holds_run_files",
        message: expect.stringMatching(/usr\/copy\.pem/),
      });
    }
    const other = (await createTestCa("another CA")).certPem;
    const fine = await capture([{ at: "", entries: [file("other.pem", other)] }], withCa);
    expect(names(fine.entries)).toEqual(["other.pem"]);
  });

  it("drops the root tree's entries under another tree's place", async () => {
    const { entries, files } = await capture([
      { at: "", entries: [dir("home"), file("home/shadowed"), file("top")] },
      { at: "home", entries: [file("seen")] },
    ]);
    expect(names(entries)).toEqual(["top", "home/", "home/seen"]);
    expect(files).toBe(3);
  });

  it("gives the layer back in overlay form: whiteouts as devices 0:0, opaque xattrs, owners base+k", async () => {
    const { bytes } = await capture([
      {
        at: "",
        entries: [
          dir("usr"),
          { name: "./usr/gone", type: "character-device", uid: 0, gid: 0, mode: 0, size: 0, device: [0, 0] },
          dir("opt", { uid: BASE + 3, gid: BASE + 3, pax: { "SCHILY.xattr.trusted.overlay.opaque": "y" } }),
          file("opt/new", "new"),
        ],
      },
      { at: "home", entries: [dir("sandbox", { uid: EXEC, gid: EXEC })] },
    ]);
    const overlay = await unpackTar(
      new Uint8Array(await new Response(overlayForm(stream(bytes), BASE)).arrayBuffer()),
    );
    expect(
      overlay.map((e) => [
        e.header.name,
        e.header.type,
        e.header.uid,
        e.header.pax?.["SCHILY.xattr.trusted.overlay.opaque"] ?? null,
      ]),
    ).toEqual([
      ["usr/", "directory", BASE, null],
      ["usr/gone", "character-device", 0, null],
      ["opt/", "directory", BASE + 3, null],
      ["opt/", "directory", BASE + 3, "y"],
      ["opt/new", "file", BASE, null],
      ["home/", "directory", BASE, null],
      ["home/sandbox/", "directory", BASE + 1, null],
    ]);
    expect(new TextDecoder().decode(overlay[4]?.data)).toBe("new");
  });
});
