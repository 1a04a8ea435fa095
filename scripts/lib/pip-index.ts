import { createHash } from "node:crypto";
import { crc32 } from "node:zlib";

// A real pip package index for the example benchmark (examples/pip-bench) and its end-to-end
// test: a wheel of a tiny pure-Python package, built here byte for byte (a zip of stored
// entries with the *.dist-info files pip checks: METADATA, WHEEL, RECORD with every file's
// sha256), and the PEP 503 "simple" pages that point at it. The upstream server
// (scripts/demo/upstream-server.mjs) serves them as static routes over HTTPS with the suite's
// test CA, from the upstream's own network namespace (scripts/lib/demo-upstream.ts).
//
// Hand-written rather than a zip library: a wheel needs only stored entries, central directory
// and end record (about sixty lines with node:zlib's crc32), and fixed timestamps make the wheel,
// so its sha256 in the index page, the same on every build.

/** The index host the example's pip.conf names, served by the demo upstream. */
export const INDEX_HOST = "pypi.demo.test";

export interface Wheel {
  /** `{name}-{version}-py3-none-any.whl` */
  filename: string;
  bytes: Buffer;
  sha256: string;
}

export interface PythonPackage {
  /** The distribution name as pip is asked for it (also the import name). */
  name: string;
  version: string;
  summary: string;
  /** Paths inside the wheel (the package's modules) → their text. */
  files: Record<string, string>;
}

/** The package the example benchmark installs: a stdlib-only text scorer. */
export const BENCH_PACKAGE: PythonPackage = {
  name: "benchscore",
  version: "1.0.0",
  summary: "Scores a model's answer against a reference (Benchwright's example benchmark).",
  files: {
    "benchscore/__init__.py": [
      '"""Scores an answer against a reference: exact match and token overlap."""',
      "",
      '__version__ = "1.0.0"',
      "",
      "",
      "def _tokens(text):",
      "    return [t for t in text.lower().split() if t]",
      "",
      "",
      "def score(answer, reference):",
      '    """{"exact": bool, "overlap": float in [0, 1]} of answer against reference."""',
      "    a, r = _tokens(answer), _tokens(reference)",
      "    common = len(set(a) & set(r))",
      "    overlap = common / len(set(r)) if r else 0.0",
      '    return {"exact": a == r, "overlap": round(overlap, 4)}',
      "",
    ].join("\n"),
  },
};

/** RECORD's hash form: sha256, urlsafe base64 without padding. */
const recordHash = (data: Buffer) => `sha256=${createHash("sha256").update(data).digest("base64url")}`;

/** A wheel pip installs: the package's files, then METADATA, WHEEL and RECORD (last, by convention). */
export function buildWheel(pkg: PythonPackage): Wheel {
  const distInfo = `${pkg.name}-${pkg.version}.dist-info`;
  const files: Array<[string, Buffer]> = Object.entries(pkg.files)
    .sort(([a], [b]) => (a < b ? -1 : 1))
    .map(([path, text]) => [path, Buffer.from(text)]);
  files.push([
    `${distInfo}/METADATA`,
    Buffer.from(
      `Metadata-Version: 2.1\nName: ${pkg.name}\nVersion: ${pkg.version}\nSummary: ${pkg.summary}\n`,
    ),
  ]);
  files.push([
    `${distInfo}/WHEEL`,
    Buffer.from(
      "Wheel-Version: 1.0\nGenerator: benchwright-tests (1.0)\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    ),
  ]);
  const record = [
    ...files.map(([path, data]) => `${path},${recordHash(data)},${data.byteLength}`),
    `${distInfo}/RECORD,,`,
    "",
  ].join("\n");
  files.push([`${distInfo}/RECORD`, Buffer.from(record)]);
  const bytes = storedZip(files);
  return {
    filename: `${pkg.name}-${pkg.version}-py3-none-any.whl`,
    bytes,
    sha256: createHash("sha256").update(bytes).digest("hex"),
  };
}

/** A zip of stored (uncompressed) entries, all dated 1980-01-01 00:00, mode 0644. */
export function storedZip(files: Array<[string, Buffer]>): Buffer {
  const DOS_TIME = 0;
  const DOS_DATE = (0 << 9) | (1 << 5) | 1; // 1980-01-01
  const UTF8 = 0x0800;
  const locals: Buffer[] = [];
  const centrals: Buffer[] = [];
  let offset = 0;
  for (const [path, data] of files) {
    const name = Buffer.from(path, "utf8");
    const crc = crc32(data);
    const local = Buffer.alloc(30);
    local.writeUInt32LE(0x04034b50, 0);
    local.writeUInt16LE(20, 4); // version needed
    local.writeUInt16LE(UTF8, 6);
    local.writeUInt16LE(0, 8); // stored
    local.writeUInt16LE(DOS_TIME, 10);
    local.writeUInt16LE(DOS_DATE, 12);
    local.writeUInt32LE(crc, 14);
    local.writeUInt32LE(data.byteLength, 18);
    local.writeUInt32LE(data.byteLength, 22);
    local.writeUInt16LE(name.byteLength, 26);
    local.writeUInt16LE(0, 28); // extra
    const central = Buffer.alloc(46);
    central.writeUInt32LE(0x02014b50, 0);
    central.writeUInt16LE((3 << 8) | 20, 4); // made by: unix, 2.0
    central.writeUInt16LE(20, 6);
    central.writeUInt16LE(UTF8, 8);
    central.writeUInt16LE(0, 10);
    central.writeUInt16LE(DOS_TIME, 12);
    central.writeUInt16LE(DOS_DATE, 14);
    central.writeUInt32LE(crc, 16);
    central.writeUInt32LE(data.byteLength, 20);
    central.writeUInt32LE(data.byteLength, 24);
    central.writeUInt16LE(name.byteLength, 28);
    central.writeUInt16LE(0, 30); // extra
    central.writeUInt16LE(0, 32); // comment
    central.writeUInt16LE(0, 34); // disk
    central.writeUInt16LE(0, 36); // internal attributes
    central.writeUInt32LE((0o100644 << 16) >>> 0, 38); // external: a regular file, 0644
    central.writeUInt32LE(offset, 42);
    locals.push(local, name, data);
    centrals.push(central, name);
    offset += local.byteLength + name.byteLength + data.byteLength;
  }
  const directory = Buffer.concat(centrals);
  const end = Buffer.alloc(22);
  end.writeUInt32LE(0x06054b50, 0);
  end.writeUInt16LE(0, 4);
  end.writeUInt16LE(0, 6);
  end.writeUInt16LE(files.length, 8);
  end.writeUInt16LE(files.length, 10);
  end.writeUInt32LE(directory.byteLength, 12);
  end.writeUInt32LE(offset, 16);
  end.writeUInt16LE(0, 20);
  return Buffer.concat([...locals, directory, end]);
}

/** One file the upstream serves for a host (scripts/demo/upstream-server.mjs, `static`). */
export interface StaticRoute {
  host: string;
  path: string;
  contentType: string;
  /** The body, base64 (it travels to the server as JSON). */
  base64: string;
}

/** PEP 503's normalized project name. */
export const normalize = (name: string) => name.toLowerCase().replace(/[-_.]+/g, "-");

/**
 * The routes of a PEP 503 simple index on `host`: /simple/ (every project), /simple/<name>/ (its
 * files, each link carrying the file's sha256, which pip checks) and /files/<wheel>.
 */
export function pipIndexRoutes(
  host: string,
  wheels: Array<{ pkg: PythonPackage; wheel: Wheel }>,
): StaticRoute[] {
  const html = (body: string) => ({
    contentType: "text/html; charset=utf-8",
    base64: Buffer.from(`<!DOCTYPE html>\n<html><body>\n${body}</body></html>\n`).toString("base64"),
  });
  const names = [...new Set(wheels.map((w) => normalize(w.pkg.name)))].sort();
  const routes: StaticRoute[] = [
    { host, path: "/simple/", ...html(names.map((n) => `<a href="${n}/">${n}</a>\n`).join("")) },
  ];
  for (const name of names) {
    const links = wheels
      .filter((w) => normalize(w.pkg.name) === name)
      .map(
        (w) => `<a href="../../files/${w.wheel.filename}#sha256=${w.wheel.sha256}">${w.wheel.filename}</a>\n`,
      );
    routes.push({ host, path: `/simple/${name}/`, ...html(links.join("")) });
  }
  for (const { wheel } of wheels) {
    routes.push({
      host,
      path: `/files/${wheel.filename}`,
      contentType: "application/octet-stream",
      base64: wheel.bytes.toString("base64"),
    });
  }
  return routes;
}

/** The index the example benchmark installs from: BENCH_PACKAGE's wheel on INDEX_HOST. */
export function benchIndexRoutes(host = INDEX_HOST): StaticRoute[] {
  return pipIndexRoutes(host, [{ pkg: BENCH_PACKAGE, wheel: buildWheel(BENCH_PACKAGE) }]);
}

/**
 * Generated packages for the setup bench (bench/setup-bench.ts): `count` pure-Python packages
 * `bwbench<i>`, each of `modules` modules of plain functions, so that installing them and
 * byte-compiling them (compileall) is work a real setup does. Deterministic: the same wheels, so
 * the same hashes, on every build.
 */
export function generatedPackages(count: number, modules: number): PythonPackage[] {
  return Array.from({ length: count }, (_, p) => {
    const name = `bwbench${p}`;
    const files: Record<string, string> = {
      [`${name}/__init__.py`]: `"""Generated for Benchwright's setup bench."""\n\n__version__ = "1.0.0"\n`,
    };
    for (let m = 0; m < modules; m++) {
      const body = Array.from(
        { length: 40 },
        (_, f) =>
          `def f${f}(xs):\n    """Sum of the squares of xs plus ${f}."""\n    total = ${f}\n    for x in xs:\n        total += x * x\n    return total\n`,
      );
      files[`${name}/m${m}.py`] = `${body.join("\n\n")}`;
    }
    return { name, version: "1.0.0", summary: `Setup bench package ${p}`, files };
  });
}
