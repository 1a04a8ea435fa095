import type { z } from "zod";
import { fail } from "../errors";

// Opaque keyset cursors for the list routes: the last row's position as a JSON array, base64url.
// Whatever comes back is parsed with the list's own shape; anything else is not ours.

export function encodeCursor(position: readonly unknown[]): string {
  return btoa(JSON.stringify(position)).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
}

export function decodeCursor<T>(cursor: string, shape: z.ZodType<T>): T | null {
  try {
    const parsed = shape.safeParse(JSON.parse(atob(cursor.replaceAll("-", "+").replaceAll("_", "/"))));
    return parsed.success ? parsed.data : null;
  } catch {
    return null;
  }
}

export const badCursor = () => fail("invalid_request", "cursor: not a cursor this API gave");
