import type { Transform } from "node:stream";
import { createBrotliDecompress, createGunzip, createInflate } from "node:zlib";

// HTTP/1.1 message rules the proxy enforces on top of Node's strict parser, so that no message
// whose framing two parties could read differently is ever forwarded (cases A1–A5), and no
// hop-by-hop or run-internal header crosses the proxy in either direction (case B4).

/** Headers that belong to one hop, or to the proxy and the run, never forwarded. */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authorization",
  "proxy-authenticate",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
  "host",
  "expect",
  "http2-settings",
]);
const INTERNAL_PREFIX = "x-benchwright-";

const CONTENT_LENGTH = /^(0|[1-9][0-9]{0,15})$/;

/** Returns why the message's framing is ambiguous, or null when it is sound. */
export function checkFraming(rawHeaders: readonly string[]): string | null {
  const lengths: string[] = [];
  const encodings: string[] = [];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = (rawHeaders[i] ?? "").toLowerCase();
    const value = rawHeaders[i + 1] ?? "";
    // biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what is refused
    if (/[\u0000\r\n]/.test(value) || /[\u0000\r\n]/.test(name)) return "control character in a header"; // A5
    if (name === "content-length") lengths.push(value);
    if (name === "transfer-encoding") encodings.push(value);
  }
  if (lengths.length > 0 && encodings.length > 0) return "both Content-Length and Transfer-Encoding"; // A1
  if (lengths.length > 1) return "more than one Content-Length"; // A2
  if (lengths.length === 1 && !CONTENT_LENGTH.test(lengths[0] as string)) return "malformed Content-Length"; // A2
  if (encodings.length > 1) return "more than one Transfer-Encoding"; // A3
  if (encodings.length === 1 && (encodings[0] as string).toLowerCase() !== "chunked") {
    return "Transfer-Encoding other than exactly chunked"; // A3
  }
  return null;
}

function connectionListed(values: readonly string[]): Set<string> {
  const out = new Set<string>();
  for (const v of values)
    for (const token of v.split(",")) if (token.trim()) out.add(token.trim().toLowerCase());
  return out;
}

function dropped(name: string, listed: ReadonlySet<string>): boolean {
  return HOP_BY_HOP.has(name) || listed.has(name) || name.startsWith(INTERNAL_PREFIX);
}

const NOTHING_LISTED: ReadonlySet<string> = new Set();

/** Request headers to send upstream (lowercase names, order kept). */
export function filterRequestHeaders(rawHeaders: readonly string[]): Array<[string, string]> {
  // The names a Connection header lists are dropped too; most requests send none, or a bare
  // keep-alive, so the set is built only when there is one.
  let connection: string[] | null = null;
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i] ?? "";
    if (name.length !== 10 || name.toLowerCase() !== "connection") continue;
    connection ??= [];
    connection.push(rawHeaders[i + 1] ?? "");
  }
  const listed = connection === null ? NOTHING_LISTED : connectionListed(connection);
  const out: Array<[string, string]> = [];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = (rawHeaders[i] ?? "").toLowerCase();
    if (!dropped(name, listed)) out.push([name, rawHeaders[i + 1] ?? ""]);
  }
  return out;
}

/** Response headers to hand back to the sandbox. */
export function filterResponseHeaders(
  headers: Record<string, string | string[] | undefined>,
): Array<[string, string]> {
  const conn = headers.connection;
  const listed = connectionListed(conn === undefined ? [] : Array.isArray(conn) ? conn : [conn]);
  const out: Array<[string, string]> = [];
  for (const [k, v] of Object.entries(headers)) {
    const name = k.toLowerCase();
    if (v === undefined || dropped(name, listed)) continue;
    for (const value of Array.isArray(v) ? v : [v]) out.push([name, value]);
  }
  return out;
}

/**
 * Decoders for a Content-Encoding list, last-applied first; null when a coding is unknown (the
 * proxy and the model lane then refuse the response: the scrubber could not read it, B7).
 */
export function decodersFor(value: string | string[] | undefined): Transform[] | null {
  const codings = (Array.isArray(value) ? value.join(",") : (value ?? ""))
    .split(",")
    .map((c) => c.trim().toLowerCase())
    .filter((c) => c !== "" && c !== "identity");
  const out: Transform[] = [];
  for (const coding of codings.reverse()) {
    if (coding === "gzip" || coding === "x-gzip") out.push(createGunzip());
    else if (coding === "deflate") out.push(createInflate());
    else if (coding === "br") out.push(createBrotliDecompress());
    else return null;
  }
  return out;
}
