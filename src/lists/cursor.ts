import type { KeyRing } from "@benchwright/shared/contract/key-ring";
import { CURSOR_MAX_LENGTH, CursorBody, type ListName } from "@benchwright/shared/contract/list";
import type { z } from "zod";
import { encodeBase64Url, timingSafeEqualHex } from "../crypto/api-keys";
import { keyedDigest } from "../crypto/vault-crypto";
import { fail, ok, type Result } from "../errors";

// The sealed cursors of shared/contract/list.ts. The mac is a keyed digest under the vault KEK
// (its own derived key, `list-cursor`), over the body, which names the list and the environment:
// so no caller can forge a position, carry one list's cursor to another list, or one
// environment's to another. Rotating the KEK keeps old cursors readable while their key id is in
// the ring; a cursor is a position, not a credential, so nothing else about it expires.

const PURPOSE = "list-cursor";
const encoder = new TextEncoder();
const decoder = new TextDecoder();
// A copy, so the digest gets the ArrayBuffer-backed bytes it asks for.
const bytesOf = (text: string) => new Uint8Array(encoder.encode(text));

/** What a list page asks for: the request's limit and cursor, and the ring the cursor is sealed with. */
export interface PageRequest {
  readonly limit: number;
  readonly cursor?: string | undefined;
  readonly ring: KeyRing;
}

/** A page of a list: its items and the cursor of the next page (null on the last). */
export interface Page<T> {
  items: T[];
  nextCursor: string | null;
}

async function seal(ring: KeyRing, body: CursorBody): Promise<string> {
  const text = encodeBase64Url(bytesOf(JSON.stringify(body)));
  return `${text}.${await keyedDigest(ring, PURPOSE, bytesOf(text))}`;
}

const refuse = (why: string) => fail("invalid_cursor", `cursor: ${why}`);

/**
 * The position a cursor holds for this list and environment, null for no cursor (the first
 * page), or invalid_cursor: not sealed by this deployment (or changed since), another list's,
 * another environment's, or a key of the wrong shape.
 */
export async function openCursor<T>(
  page: PageRequest,
  list: ListName,
  environmentId: string,
  shape: z.ZodType<T>,
): Promise<Result<T | null>> {
  const { cursor, ring } = page;
  if (cursor === undefined) return ok(null);
  const parts = cursor.length <= CURSOR_MAX_LENGTH ? cursor.split(".") : [];
  if (parts.length !== 3) return refuse("not a cursor this API gave");
  const [text, keyId, mac] = parts as [string, string, string];
  if (!ring.keyIds.includes(keyId)) return refuse("not a cursor this API gave");
  const expected = await keyedDigest(ring, PURPOSE, bytesOf(text), keyId);
  if (!timingSafeEqualHex(expected, `${keyId}.${mac}`)) return refuse("not a cursor this API gave");
  const body = parseBody(text);
  if (!body) return refuse("not a cursor this API gave");
  if (body.env !== environmentId) return refuse("another environment's cursor");
  if (body.list !== list) return refuse(`a cursor of another list (${body.list}), not of ${list}`);
  const key = shape.safeParse(body.key);
  return key.success ? ok(key.data) : refuse("not a cursor this API gave");
}

function parseBody(text: string): CursorBody | null {
  try {
    const binary = atob(text.replaceAll("-", "+").replaceAll("_", "/"));
    const json = decoder.decode(Uint8Array.from(binary, (ch) => ch.charCodeAt(0)));
    const parsed = CursorBody.safeParse(JSON.parse(json));
    return parsed.success ? parsed.data : null;
  } catch {
    return null;
  }
}

/**
 * The page of `rows` (fetched with `limit + 1` to see whether more follow) and the sealed cursor
 * of its last item's key, for this list and environment.
 */
export async function pageOf<T>(
  page: PageRequest,
  list: ListName,
  environmentId: string,
  rows: T[],
  key: (row: T) => CursorBody["key"],
): Promise<Page<T>> {
  const items = rows.slice(0, page.limit);
  const last = items.at(-1);
  return {
    items,
    nextCursor:
      rows.length > page.limit && last !== undefined
        ? await seal(page.ring, { list, env: environmentId, key: key(last) })
        : null,
  };
}
