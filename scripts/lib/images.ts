import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { buildah, buildahMissing, tail, withBuildLock } from "../../local-agent/buildah";
import { expandCopyHeredocs } from "./heredoc";
import { imageBytes } from "./image-publish";
import { ensureNodeBase } from "./node-base";

// The four images of proxy-image/, built daemonless from their committed Dockerfiles: buildah
// (chroot isolation, overlay storage or else vfs, see buildah.ts) with the layer cache, so the build stage they
// share is made once and an unchanged image rebuilds from cache in seconds; the base is the local
// build of node:24-bookworm-slim (node-base.ts), passed as BASE_IMAGE. The context is the
// repository root, cut down by .dockerignore to what the Dockerfiles copy.

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
/** Scratch files of the builds (gitignored; the heredoc bodies are in the build context). */
const SCRATCH = ".images";

export const IMAGES = [
  { name: "proxy", dockerfile: "proxy-image/Dockerfile", tag: "localhost/benchwright-proxy" },
  { name: "e2b-proxy", dockerfile: "proxy-image/e2b.Dockerfile", tag: "localhost/benchwright-e2b-proxy" },
  { name: "e2b-work", dockerfile: "proxy-image/e2b-work.Dockerfile", tag: "localhost/benchwright-e2b-work" },
  // The local backend's sandbox root filesystem (local-agent/rootfs.ts exports it).
  { name: "work", dockerfile: "proxy-image/work.Dockerfile", tag: "localhost/benchwright-work" },
] as const;
export type ImageName = (typeof IMAGES)[number]["name"];

export type ImageBuild = { name: ImageName; tag: string; seconds: number } & (
  | {
      ok: true;
      /** The image's size: its layers uncompressed (image-publish.ts imageBytes). */
      bytes: number;
    }
  | { ok: false; error: string }
);

/** The Dockerfile buildah is given: the committed one, or its heredoc-free rewrite (heredoc.ts). */
function dockerfileFor(image: (typeof IMAGES)[number]): string {
  const text = readFileSync(join(ROOT, image.dockerfile), "utf8");
  const { dockerfile, files } = expandCopyHeredocs(text, `${SCRATCH}/heredoc/${image.name}`);
  if (files.size === 0) return join(ROOT, image.dockerfile);
  for (const [path, content] of files) writeIfChanged(join(ROOT, path), content);
  const rewritten = join(ROOT, SCRATCH, `${image.name}.Dockerfile`);
  writeIfChanged(rewritten, dockerfile);
  return rewritten;
}

// Where this machine reaches the npm registry through a TLS-inspecting gateway, its tools trust
// the gateway's CA through NODE_EXTRA_CA_CERTS or npm's cafile; the build's npm gets the same
// bundle, bind-mounted for the RUN steps only (never copied into a layer; an empty mount point
// is all that is left), with an npmrc naming it at npm's global config path. Elsewhere: nothing.
function hostTrust(): string[] {
  const bundle = process.env.NODE_EXTRA_CA_CERTS || npmCafile();
  if (!bundle || !existsSync(bundle)) return [];
  const npmrc = join(ROOT, SCRATCH, "npmrc");
  writeIfChanged(npmrc, "cafile=/run/bw-host-ca.crt\n");
  return ["--volume", `${bundle}:/run/bw-host-ca.crt:ro`, "--volume", `${npmrc}:/usr/local/etc/npmrc:ro`];
}

function npmCafile(): string | null {
  const r = spawnSync("npm", ["config", "get", "cafile"], { encoding: "utf8" });
  const value = r.stdout?.trim();
  return r.status === 0 && value && value !== "null" && value !== "undefined" ? value : null;
}

// An unchanged file keeps its mtime, so nothing about it looks new to the layer cache.
function writeIfChanged(path: string, content: string): void {
  try {
    if (readFileSync(path, "utf8") === content) return;
  } catch {}
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, content);
}

/**
 * Builds the base if the store lacks it, then each image (all four, or `only`), one at a time:
 * one result per image with its size, a failed build's with the end of its output. `log` gets
 * progress lines.
 * Holds the machine's build lock meanwhile (withBuildLock), waiting for another build first.
 */
export async function buildImages(
  opts: { only?: readonly ImageName[]; log?: (line: string) => void; verbose?: boolean } = {},
): Promise<{ base: { ref: string; built: boolean; seconds: number }; images: ImageBuild[] }> {
  return withBuildLock(() => buildUnlocked(opts));
}

async function buildUnlocked(opts: {
  only?: readonly ImageName[];
  log?: (line: string) => void;
  verbose?: boolean;
}): Promise<{ base: { ref: string; built: boolean; seconds: number }; images: ImageBuild[] }> {
  const log = opts.log ?? (() => {});
  const started = Date.now();
  const base = await ensureNodeBase((step) => log(`base: ${step}`));
  const baseSeconds = (Date.now() - started) / 1000;
  const images: ImageBuild[] = [];
  for (const image of IMAGES.filter((i) => !opts.only || opts.only.includes(i.name))) {
    const t = Date.now();
    const r = await buildah(
      [
        "build",
        "--isolation",
        "chroot",
        "--layers",
        // A failed build removes its containers too (buildah keeps them by default).
        "--force-rm",
        "--pull=never",
        "--build-arg",
        `BASE_IMAGE=${base.ref}`,
        ...hostTrust(),
        "-f",
        dockerfileFor(image),
        "-t",
        image.tag,
        ROOT,
      ],
      opts.verbose ? { onLine: (line) => log(`${image.name}: ${line}`) } : undefined,
    );
    const seconds = (Date.now() - t) / 1000;
    const { name, tag } = image;
    const bytes = r.code === 0 ? await imageBytes(tag) : null;
    images.push(
      bytes !== null
        ? { name, tag, seconds, ok: true, bytes }
        : {
            name,
            tag,
            seconds,
            ok: false,
            error: r.code === 0 ? `${tag} is not in the store after its build` : tail(r),
          },
    );
  }
  return { base: { ...base, seconds: baseSeconds }, images };
}

/**
 * The work image (the local backend's sandboxes' root filesystem: the host agent exports it),
 * built when the store lacks it or its Dockerfile changed: seconds from the layer cache. Null
 * when it is there, else why it is not (this machine cannot build, or the build failed).
 */
export async function ensureWorkImage(log?: (line: string) => void): Promise<string | null> {
  const missing = buildahMissing();
  if (missing) return missing;
  const { images } = await buildImages({ only: ["work"], log });
  const work = images[0];
  if (!work) return "the work image was not built";
  return work.ok ? null : `the work image did not build:\n${work.error}`;
}
