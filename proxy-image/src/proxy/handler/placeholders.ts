import type { Readable } from "node:stream";
import {
  MAX_PLACEHOLDER_BODY_BYTES,
  PLACEHOLDER_PREFIX,
  placeholderValue,
} from "@benchwright/shared/contract/placeholder";
import type { PolicyDocument, PolicyRule } from "@benchwright/shared/contract/policy";
import { Refusal } from "./refusal";

// Placeholders (case N2): the sandboxes hold `bw-placeholder-<SECRET>-<nonce>` where code expects
// a key. On a request the proxy terminates to host H whose first matching rule is R, R's
// placeholder is swapped for R's secret in every header value (a client-built `Basic` credential
// decoded, swapped and re-encoded) and in the query, and in the body only where R opts in
// (placeholderIn ["body"]). Any run placeholder left after that goes out as it is and is counted as
// a stray (host and secret name). Bodies are never scanned for strays: that would mean buffering
// every body of every host.

/** What a forward decision swaps and looks for; null when the run has no nonce or no rules. */
export interface PlaceholderSwap {
  /** R's placeholder and secret, or null when no rule matched the host. */
  own: { placeholder: string; secret: string; body: boolean } | null;
  /** Every run placeholder → its secret's name. */
  all: ReadonlyMap<string, string>;
}

const known = new WeakMap<PolicyDocument, { nonce: string; all: Map<string, string> }>();

/** The run's placeholders: one per secret its rules name, built once per policy document. */
function placeholdersOf(policy: PolicyDocument, nonce: string): Map<string, string> {
  const cached = known.get(policy);
  if (cached?.nonce === nonce) return cached.all;
  const all = new Map<string, string>();
  for (const rule of policy.rules) all.set(placeholderValue(rule.secret, nonce), rule.secret);
  known.set(policy, { nonce, all });
  return all;
}

export function placeholderSwap(
  policy: PolicyDocument,
  rule: PolicyRule | null,
  secret: string | null,
  nonce: string | undefined,
): PlaceholderSwap | null {
  if (!nonce) return null;
  const all = placeholdersOf(policy, nonce);
  if (all.size === 0) return null;
  const own =
    rule && secret !== null
      ? {
          placeholder: placeholderValue(rule.secret, nonce),
          secret,
          body: rule.placeholderIn.includes("body"),
        }
      : null;
  return { own, all };
}

export interface SwappedRequest {
  headers: Array<[string, string]>;
  path: string;
  /** Secret names of the placeholders left in headers or query (each once). */
  strays: string[];
  /** The `Basic` credentials made with the secret: the response is masked of these too (B7). */
  basicForms: string[];
}

const BASIC = /^(\s*basic\s+)([A-Za-z0-9+/]+={0,2})(\s*)$/i;

/** Swaps R's placeholder in headers and query and finds what is left; `swap` null: unchanged. */
export function swapRequest(
  swap: PlaceholderSwap | null,
  headers: ReadonlyArray<[string, string]>,
  path: string,
): SwappedRequest {
  if (swap === null) return { headers: [...headers], path, strays: [], basicForms: [] };
  const strays = new Set<string>();
  const basicForms: string[] = [];
  const own = swap.own;
  const out = headers.map(([name, value]): [string, string] => {
    let v = value;
    if (own && v.includes(own.placeholder)) v = v.replaceAll(own.placeholder, own.secret);
    const basic = BASIC.exec(v);
    if (basic) {
      let decoded = Buffer.from(basic[2] as string, "base64").toString("latin1");
      if (own && decoded.includes(own.placeholder)) {
        // Latin-1 both ways, as a rule's own basic injection encodes its secret (inject.ts).
        decoded = decoded.replaceAll(own.placeholder, own.secret);
        const encoded = Buffer.from(decoded, "latin1").toString("base64");
        basicForms.push(encoded);
        v = `${basic[1]}${encoded}${basic[3]}`;
      }
      findStrays(decoded, swap.all, strays);
    }
    findStrays(v, swap.all, strays);
    return [name, v];
  });
  const q = path.indexOf("?");
  let outPath = path;
  if (q !== -1) {
    let query = path.slice(q);
    if (own && query.includes(own.placeholder))
      query = query.replaceAll(own.placeholder, encodeURIComponent(own.secret));
    findStrays(query, swap.all, strays);
    outPath = path.slice(0, q) + query;
  }
  return { headers: out, path: outPath, strays: [...strays], basicForms };
}

function findStrays(text: string, all: ReadonlyMap<string, string>, into: Set<string>): void {
  if (!text.includes(PLACEHOLDER_PREFIX)) return;
  for (const [placeholder, name] of all) if (text.includes(placeholder)) into.add(name);
}

/**
 * R's body, read whole and swapped, for a rule that opts in: at most MAX_PLACEHOLDER_BODY_BYTES
 * (413 past it), and never an encoded one (415: a compressed body cannot be swapped, and sending
 * it unswapped would hand the upstream a placeholder where the rule asked for its secret).
 * `headers` get the new Content-Length.
 */
export async function swapBody(
  body: Readable,
  headers: Array<[string, string]>,
  own: NonNullable<PlaceholderSwap["own"]>,
): Promise<Buffer> {
  const encodings = headers
    .filter(([k]) => k === "content-encoding")
    .flatMap(([, v]) => v.split(","))
    .map((c) => c.trim().toLowerCase())
    .filter((c) => c !== "" && c !== "identity");
  if (encodings.length > 0) {
    body.resume();
    throw new Refusal(
      415,
      "refuse",
      "placeholder body is content-encoded",
      "Refused: this host's rule swaps its placeholder in request bodies, and this body has a " +
        `Content-Encoding (${encodings.join(", ")}) the proxy cannot swap in. Send it uncompressed.\n`,
    );
  }
  const declared = headers.find(([k]) => k === "content-length");
  if (declared && Number(declared[1]) > MAX_PLACEHOLDER_BODY_BYTES) throw tooLarge();
  const whole = await readCapped(body);
  const swapped = replaceAll(whole, Buffer.from(own.placeholder), Buffer.from(own.secret));
  for (let i = headers.length - 1; i >= 0; i--)
    if (headers[i]?.[0] === "content-length") headers.splice(i, 1);
  headers.push(["content-length", String(swapped.length)]);
  return swapped;
}

/**
 * The body whole, or a 413 once it passes the bound. The rest is then drained, not destroyed: a
 * destroyed request takes its socket along, and the client would never read the refusal.
 */
function readCapped(body: Readable): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    body.on("data", (chunk: Buffer) => {
      if (size > MAX_PLACEHOLDER_BODY_BYTES) return;
      size += chunk.length;
      if (size <= MAX_PLACEHOLDER_BODY_BYTES) return void chunks.push(chunk);
      chunks.length = 0;
      reject(tooLarge());
    });
    body.once("end", () => resolve(Buffer.concat(chunks)));
    body.once("error", reject);
    // After 'end' this settles nothing: the promise is resolved already.
    body.once("close", () => reject(new Error("the request body ended early")));
  });
}

function tooLarge(): Refusal {
  return new Refusal(
    413,
    "refuse",
    "placeholder body too large",
    `Refused: this host's rule swaps its placeholder in request bodies, which the proxy reads whole, ` +
      `up to ${MAX_PLACEHOLDER_BODY_BYTES} bytes; this body is larger.\n`,
  );
}

function replaceAll(buf: Buffer, needle: Buffer, by: Buffer): Buffer {
  let at = buf.indexOf(needle);
  if (at === -1) return buf;
  const parts: Buffer[] = [];
  let from = 0;
  while (at !== -1) {
    parts.push(buf.subarray(from, at), by);
    from = at + needle.length;
    at = buf.indexOf(needle, from);
  }
  parts.push(buf.subarray(from));
  return Buffer.concat(parts);
}
