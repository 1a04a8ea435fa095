import { env } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { packTar } from "modern-tar";
import { describe, expect, it } from "vitest";
import { bundleKey } from "../../src/bundles/service";
import { bundles } from "../../src/db/schema";
import { file, gzip, sha256Hex, tarGz, upload } from "./archives";
import { expectProblem, newTenant, type Tenant, withDb } from "./harness";

// POST /v1/bundles and GET /v1/bundles/{sha256} inside workerd, with the real local R2 of the
// test plugin and real Postgres: real .tar.gz archives, checked entry by entry (shared/archive).

const rows = (t: Tenant) =>
  withDb((db) => db.select().from(bundles).where(eq(bundles.environmentId, t.environmentId)));

/** The R2 keys under the tenant's bundles/. */
async function stored(t: Tenant): Promise<string[]> {
  return (await env.FILES.list({ prefix: `bundles/${t.environmentId}/` })).objects.map((o) => o.key);
}

const benchmark = () =>
  tarGz([
    { header: { name: "bench/", type: "directory", size: 0 } },
    file("bench/setup.sh", "pip install -r requirements.txt\n"),
    file("bench/task_impl.py", "print('hello')\n"),
    file("bench/requirements.txt", "requests==2.32.3\n"),
    { header: { name: "bench/run.py", type: "symlink", size: 0, linkname: "task_impl.py" } },
  ]);

describe("bundles: upload and read", () => {
  it("stores a .tar.gz by its sha256 (201), in R2 and Postgres; GET reads it back", async () => {
    const t = await newTenant();
    const bytes = await benchmark();
    const sha256 = await sha256Hex(bytes);
    const res = await upload(t.key, bytes);
    expect(res.status, res.text).toBe(201);
    expect(res.json).toEqual({
      sha256,
      size: bytes.length,
      // bench/, three files and the symlink.
      files: 5,
      unpackedBytes: 32 + 15 + 17,
      createdAt: expect.any(String),
    });
    const object = await env.FILES.get(bundleKey(t.environmentId, sha256));
    expect(object).not.toBeNull();
    expect(await sha256Hex(new Uint8Array(await (object as R2ObjectBody).arrayBuffer()))).toBe(sha256);
    expect(await rows(t)).toHaveLength(1);
    const read = await t.api("GET", `/v1/bundles/${sha256}`);
    expect(read.status).toBe(200);
    expect(read.json).toEqual(res.json);
  });

  it("a re-upload of the same bytes answers 200 with the same body; one row, one object", async () => {
    const t = await newTenant();
    const bytes = await benchmark();
    const first = await upload(t.key, bytes);
    expect(first.status).toBe(201);
    // Streamed without a Content-Length this time: the same bytes, the same bundle.
    const again = await upload(t.key, bytes, { type: "application/octet-stream", chunked: true });
    expect(again.status, again.text).toBe(200);
    expect(again.json).toEqual(first.json);
    expect(await rows(t)).toHaveLength(1);
    expect(await stored(t)).toEqual([bundleKey(t.environmentId, first.json.sha256)]);
  });

  it("refuses what is not a .tar.gz upload with exact codes", async () => {
    const t = await newTenant();
    const bytes = await benchmark();
    expectProblem(await upload(t.key, bytes, { type: "application/json" }), 415, "unsupported_media_type");
    expectProblem(await upload(t.key, bytes, { type: "text/plain" }), 415, "unsupported_media_type");
    expectProblem(await upload(t.key, new TextEncoder().encode("not gzip at all")), 422, "bundle_invalid");
    // gzip, but not a tar inside.
    expectProblem(
      await upload(t.key, await gzip(new TextEncoder().encode("x".repeat(600)))),
      422,
      "bundle_invalid",
    );
    expectProblem(await upload(t.key, new Uint8Array(0)), 422, "bundle_invalid");
    expectProblem(await t.api("GET", "/v1/bundles/ABC"), 400, "invalid_request");
    expectProblem(await t.api("GET", `/v1/bundles/${"0".repeat(64)}`), 404, "bundle_not_found");
    expect(await rows(t)).toEqual([]);
    expect(await stored(t)).toEqual([]);
  });

  it("refuses an upload past BUNDLE_MAX_BYTES with 413, by its Content-Length or while reading", async () => {
    const t = await newTenant();
    const bytes = await tarGz([file("big.bin", crypto.getRandomValues(new Uint8Array(8_000)))]);
    expect(bytes.length).toBeGreaterThan(8_000);
    const small = { ...env, BUNDLE_MAX_BYTES: String(bytes.length - 1) };
    const declared = expectProblem(
      await upload(t.key, bytes, { bindings: small }),
      413,
      "bundle_upload_too_large",
    );
    expect(declared.json.detail).toContain(String(bytes.length - 1));
    expectProblem(
      await upload(t.key, bytes, { bindings: small, chunked: true }),
      413,
      "bundle_upload_too_large",
    );
    // At the bound exactly: accepted. And the JSON routes' 64 KiB limit does not apply here.
    const exact = { ...env, BUNDLE_MAX_BYTES: String(bytes.length) };
    expect((await upload(t.key, bytes, { bindings: exact, chunked: true })).status).toBe(201);
    const larger = await tarGz([file("larger.bin", randomBytes(200_000))]);
    expect((await upload(t.key, larger)).status).toBe(201);
    expect(await rows(t)).toHaveLength(2);
  });
});

// case H1
describe("H1 a bundle reaching out of its tree is refused with a stable code, nothing stored", () => {
  const cases: Array<[string, () => Promise<Uint8Array>, string]> = [
    [
      "a ../ path",
      () => tarGz([file("ok.txt", "ok"), file("../evil.sh", "rm -rf /")]),
      "bundle_path_traversal",
    ],
    ["a ../ deeper in", () => tarGz([file("a/b/../../../evil", "x")]), "bundle_path_traversal"],
    [
      "an absolute path",
      () => tarGz([file("/etc/cron.d/evil", "* * * * * root sh")]),
      "bundle_absolute_path",
    ],
    [
      "a symlink out of the tree",
      () => tarGz([{ header: { name: "passwd", type: "symlink", size: 0, linkname: "../../etc/passwd" } }]),
      "bundle_link_escape",
    ],
    [
      "a symlink to an absolute path",
      () => tarGz([{ header: { name: "proc", type: "symlink", size: 0, linkname: "/proc/self/environ" } }]),
      "bundle_link_escape",
    ],
    [
      "a file written through a symlink of the bundle",
      () =>
        tarGz([
          { header: { name: "dir", type: "symlink", size: 0, linkname: "." } },
          file("dir/through.txt", "x"),
        ]),
      "bundle_link_escape",
    ],
    [
      "a hardlink out of the tree",
      () => tarGz([{ header: { name: "shadow", type: "link", size: 0, linkname: "/etc/shadow" } }]),
      "bundle_link_escape",
    ],
    [
      "a character device",
      () => tarGz([{ header: { name: "null", type: "character-device", size: 0 } }]),
      "bundle_special_file",
    ],
    [
      "a block device",
      () => tarGz([{ header: { name: "sda", type: "block-device", size: 0 } }]),
      "bundle_special_file",
    ],
    ["a FIFO", () => tarGz([{ header: { name: "pipe", type: "fifo", size: 0 } }]), "bundle_special_file"],
  ];
  for (const [what, make, code] of cases) {
    it(`${what} → 422 ${code}`, async () => {
      const t = await newTenant();
      const res = expectProblem(await upload(t.key, await make()), 422, code);
      expect(res.json.detail).toMatch(/^Bundle refused: entry /);
      expect(await rows(t)).toEqual([]);
      expect(await stored(t)).toEqual([]);
    });
  }
});

// case H2
describe("H2 a decompression bomb is refused at the bound", () => {
  it("unpacked size: at BUNDLE_MAX_UNPACKED_BYTES accepted, one byte more (a tiny archive) refused", async () => {
    const t = await newTenant();
    const bound = 4 * 1024 * 1024;
    const tight = { ...env, BUNDLE_MAX_UNPACKED_BYTES: String(bound) };
    const bomb = await tarGz([file("zeros.bin", new Uint8Array(bound + 1))]);
    // Megabytes of zeros in a few KiB.
    expect(bomb.length).toBeLessThan(bound / 100);
    const res = expectProblem(await upload(t.key, bomb, { bindings: tight }), 422, "bundle_too_large");
    expect(res.json.detail).toContain(String(bound));
    // Split over two files the sum counts.
    const split = await tarGz([
      file("a.bin", new Uint8Array(bound / 2)),
      file("b.bin", new Uint8Array(bound / 2 + 1)),
    ]);
    expectProblem(await upload(t.key, split, { bindings: tight }), 422, "bundle_too_large");
    expect(await stored(t)).toEqual([]);
    const atBound = await tarGz([file("zeros.bin", new Uint8Array(bound))]);
    const ok = await upload(t.key, atBound, { bindings: tight });
    expect(ok.status, ok.text).toBe(201);
    expect(ok.json.unpackedBytes).toBe(bound);
  });

  it("the default bound (512 MiB): a 513 MiB entry in a half-MiB archive is refused", {
    timeout: 30_000,
  }, async () => {
    const t = await newTenant();
    // 513 MiB of zeros, gzipped as it is packed: the archive is about half a MiB.
    const size = 513 * 1024 * 1024;
    const tarHead = await packTar([{ header: { name: "bomb.bin", type: "file", size: 0 } }]);
    const header = tarHead.slice(0, 512);
    setSize(header, size);
    const zeros = new Uint8Array(1024 * 1024);
    let left = size + 1024; // the body, then the end-of-archive blocks (zeros too)
    const tar = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(header);
      },
      pull(c) {
        if (left <= 0) return c.close();
        const n = Math.min(left, zeros.length);
        c.enqueue(zeros.subarray(0, n));
        left -= n;
      },
    });
    const bomb = new Uint8Array(
      await new Response(tar.pipeThrough(new CompressionStream("gzip"))).arrayBuffer(),
    );
    expect(bomb.length).toBeLessThan(2 * 1024 * 1024);
    const res = expectProblem(await upload(t.key, bomb), 422, "bundle_too_large");
    expect(res.json.detail).toContain(String(size));
  });

  it("count: at BUNDLE_MAX_FILES accepted, one more refused (implied directories count)", {
    timeout: 30_000,
  }, async () => {
    const t = await newTenant();
    const tight = { ...env, BUNDLE_MAX_FILES: "50" };
    const files = (n: number) => Array.from({ length: n }, (_, i) => file(`f${i}.txt`, ""));
    expect((await upload(t.key, await tarGz(files(50)), { bindings: tight })).status).toBe(201);
    expectProblem(
      await upload(t.key, await tarGz(files(51)), { bindings: tight }),
      422,
      "bundle_too_many_files",
    );
    // 49 files under one directory no entry names: 50 things made, then one more.
    const nested = (n: number) => Array.from({ length: n }, (_, i) => file(`d/f${i}.txt`, ""));
    expect((await upload(t.key, await tarGz(nested(49)), { bindings: tight })).status).toBe(201);
    expectProblem(
      await upload(t.key, await tarGz(nested(50)), { bindings: tight }),
      422,
      "bundle_too_many_files",
    );
    expect(await rows(t)).toHaveLength(2);
  });
});

// case H3
describe("H3 bundles are per environment", () => {
  it("another environment's hash is 404 bundle_not_found; the same bytes are each environment's own", async () => {
    const [a, b] = [await newTenant(), await newTenant()];
    const bytes = await benchmark();
    const mine = await upload(a.key, bytes);
    expect(mine.status).toBe(201);
    const sha256 = mine.json.sha256 as string;
    const theirs = expectProblem(await b.api("GET", `/v1/bundles/${sha256}`), 404, "bundle_not_found");
    expect(theirs.text).not.toContain(a.environmentId);
    expectProblem(
      await b.api("POST", "/v1/runs", { commands: ["ls"], bundle: sha256 }),
      404,
      "bundle_not_found",
    );
    // B uploading the same bytes makes B's own (201, not A's 200), stored under B's prefix.
    const own = await upload(b.key, bytes);
    expect(own.status).toBe(201);
    expect(await stored(b)).toEqual([bundleKey(b.environmentId, sha256)]);
    expect((await b.api("POST", "/v1/runs", { commands: ["ls"], bundle: sha256 })).status).toBe(202);
    expect(await rows(a)).toHaveLength(1);
  });
});

function randomBytes(n: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let at = 0; at < n; at += 65_536) crypto.getRandomValues(out.subarray(at, at + 65_536));
  return out;
}

/** Writes `size` into a ustar header (octal, 11 digits and a NUL) and fixes its checksum. */
function setSize(header: Uint8Array, size: number) {
  header.set(new TextEncoder().encode(`${size.toString(8).padStart(11, "0")}\0`), 124);
  header.fill(0x20, 148, 156);
  const sum = header.reduce((n, b) => n + b, 0);
  header.set(new TextEncoder().encode(`${sum.toString(8).padStart(6, "0")}\0 `), 148);
}
