import { env } from "cloudflare:workers";
import { packTar, type TarEntry } from "modern-tar";
import { type ApiResponse, callWith } from "./harness";

// Real .tar.gz archives made inside workerd (modern-tar's packer, the runtime's gzip), and the
// upload of one to the Worker: a bundle for POST /v1/bundles, an archive as bw-collect writes it.

export async function gzip(bytes: Uint8Array): Promise<Uint8Array> {
  const stream = new Blob([bytes]).stream().pipeThrough(new CompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

export async function tarGz(entries: TarEntry[]): Promise<Uint8Array> {
  return gzip(await packTar(entries));
}

export const file = (name: string, body: string | Uint8Array): TarEntry => ({
  header: {
    name,
    type: "file",
    size: typeof body === "string" ? new TextEncoder().encode(body).length : body.length,
  },
  body,
});

export async function sha256Hex(bytes: Uint8Array | string): Promise<string> {
  const data = typeof bytes === "string" ? new TextEncoder().encode(bytes) : bytes;
  return [...new Uint8Array(await crypto.subtle.digest("SHA-256", data))]
    .map((b) => b.toString(16).padStart(2, "0"))
    .join("");
}

/**
 * POST /v1/bundles with `bytes` as the body: with its Content-Length (the default), or streamed
 * in chunks without one (`chunked`), as `type`, under `bindings` (settings a test lowers).
 */
export async function upload(
  key: string,
  bytes: Uint8Array,
  options: { type?: string; chunked?: boolean; bindings?: Env; length?: string } = {},
): Promise<ApiResponse> {
  const headers: Record<string, string> = { "content-type": options.type ?? "application/gzip" };
  if (options.length !== undefined) headers["content-length"] = options.length;
  let body: Uint8Array | ReadableStream<Uint8Array> = bytes;
  if (options.chunked) {
    let at = 0;
    body = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (at >= bytes.length) return controller.close();
        controller.enqueue(bytes.slice(at, at + 4096));
        at += 4096;
      },
    });
  }
  return callWith(options.bindings ?? env, key, "POST", "/v1/bundles", body, headers);
}

export interface CollectedFile {
  path: string;
  body: string | Uint8Array;
}

/**
 * An archive as bw-collect writes it (proxy-image/src/collect/collect.ts): a `files/<path>` entry per
 * file, then `manifest.json` listing them (with their sha256) and what was cut. `manifest`
 * overrides fields of the manifest; `extra` entries go after the files (a tampered archive).
 */
export async function collectArchive(
  files: CollectedFile[],
  options: {
    cut?: Array<{ path: string; reason: string; size: number | null }>;
    manifest?: Record<string, unknown>;
    extra?: TarEntry[];
    after?: TarEntry[];
    limits?: { maxBytes: number; maxFiles: number };
  } = {},
): Promise<Uint8Array> {
  const encoded = files.map((f) => ({
    path: f.path,
    bytes: typeof f.body === "string" ? new TextEncoder().encode(f.body) : f.body,
  }));
  const manifest = {
    files: await Promise.all(
      encoded.map(async (f) => ({ path: f.path, size: f.bytes.length, sha256: await sha256Hex(f.bytes) })),
    ),
    cut: options.cut ?? [],
    limits: options.limits ?? { maxBytes: 64 * 1024 * 1024, maxFiles: 1000 },
    missing: false,
    ...options.manifest,
  };
  return tarGz([
    ...encoded.map((f) => file(`files/${f.path}`, f.bytes)),
    ...(options.extra ?? []),
    file("manifest.json", `${JSON.stringify(manifest)}\n`),
    ...(options.after ?? []),
  ]);
}

export const streamOf = (bytes: Uint8Array): ReadableStream<Uint8Array> => new Blob([bytes]).stream();
