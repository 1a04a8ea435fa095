import type { Api, Schemas } from "../api";
import { type PackOptions, PackRefused, packFolder } from "../pack";
import { type Ctx, Failed, SPEC_FILE, UsageError } from "./shared";

// A benchmark folder up to the API: packed (cli/src/pack.ts), uploaded to POST /v1/bundles with a
// progress line on a terminal, and checked: the API names the bundle by the sha256 of the bytes
// it stored, which must be the hash of the bytes packed here.

export function size(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

export async function uploadFolder(
  ctx: Ctx,
  client: Api,
  folder: string,
  options: Pick<PackOptions, "files" | "includeSecretFiles">,
): Promise<Schemas["Bundle"] | null> {
  let packed: Awaited<ReturnType<typeof packFolder>>;
  try {
    packed = await packFolder(folder, { ...options, always: [SPEC_FILE] });
  } catch (error) {
    // Nothing was sent: exit 2, like any other command line the CLI will not carry out.
    if (error instanceof PackRefused) throw new UsageError(error.message);
    const e = error as NodeJS.ErrnoException;
    if (e.code && e.path) throw new UsageError(`cannot pack ${folder}: ${e.code} on ${e.path}`);
    throw error;
  }
  if (packed.paths.length === 1 && packed.paths[0] === SPEC_FILE) {
    // Nothing but the spec: the run needs no bundle (its commands fetch what they need).
    return null;
  }
  ctx.err(
    `packed ${folder}: ${packed.paths.length} files, ${size(packed.bytes)} (${size(packed.archive.byteLength)} gzipped), sha256 ${packed.sha256}`,
  );
  const live = process.stderr.isTTY === true;
  let drawn = 0;
  const progress = (sent: number, total: number) => {
    // A redraw at most every 100 ms, and the last one.
    if (sent < total && Date.now() - drawn < 100) return;
    drawn = Date.now();
    process.stderr.write(
      `\r\x1b[2Kuploading ${size(sent)} of ${size(total)} (${Math.floor((sent / total) * 100)}%)`,
    );
  };
  const bundle = await client.upload<Schemas["Bundle"]>(
    "/v1/bundles",
    packed.archive,
    "application/gzip",
    live ? progress : undefined,
  );
  if (live) process.stderr.write("\r\x1b[2K");
  if (bundle.sha256 !== packed.sha256) {
    throw new Failed(
      `the API stored the bundle as sha256 ${bundle.sha256}, but the bytes sent hash to ${packed.sha256}: not launched`,
    );
  }
  ctx.err(`uploaded bundle ${bundle.sha256} (${bundle.files} files, ${size(bundle.unpackedBytes)} unpacked)`);
  return bundle;
}
