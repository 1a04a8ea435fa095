import type { z } from "zod";
import { fail } from "../errors";

// The run-events cursor (src/runs/events.ts): an event's position as a JSON array, base64url,
// bound to its run by the shape that reads it. Not the lists' sealed cursor (src/lists/cursor.ts):
// every event of a page and of the live stream carries one, so it is made without a digest.
// Whatever comes back is parsed with the reader's own shape; anything else is not ours.

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

export const badCursor = () => fail("invalid_cursor", "cursor: not a cursor this API gave");
