import type { z } from "@hono/zod-openapi";

// Credentials an answer shows once (an API key, an egress-agent token and its command, a signing
// secret) are never kept with the answer an Idempotency-Key replays (case L5). A field is
// declared so with `shownOnce` in its route's schema, which marks it in the OpenAPI document;
// WITHHELD_FROM_REPLAY (./routes.ts) lists, per covered POST, the top-level fields left out of
// the stored answer, and test/worker/idempotency-credentials.test.ts checks the two agree. The
// replay is the first answer without them, with `Idempotent-Withheld` naming them.

/** The document's mark on a field shown once (an OpenAPI schema extension). */
export const SHOWN_ONCE = "x-shown-once";

/** The replay header naming the top-level fields left out of it, comma-separated. */
export const WITHHELD_HEADER = "idempotent-withheld";

/**
 * A field shown once: optional, since a replay leaves it out, and marked in the document.
 * `lost`: what a client that lost the first answer does instead.
 */
export function shownOnce<T extends z.ZodType>(schema: T, description: string, lost: string) {
  return schema.optional().openapi({
    description: `${description} Absent from a replay (\`Idempotent-Replayed: true\`, \`Idempotent-Withheld\` names it): it is never stored. Lost: ${lost}`,
    [SHOWN_ONCE]: true,
  });
}

/**
 * The answer's JSON without the withheld top-level fields, and those it had. Anything but a JSON
 * object (a problem body has none of the fields either) is kept as it is.
 */
export function withhold(text: string, withheld: readonly string[]): { text: string; left: string[] } {
  if (withheld.length === 0 || text === "") return { text, left: [] };
  const body: unknown = JSON.parse(text);
  if (typeof body !== "object" || body === null || Array.isArray(body)) return { text, left: [] };
  const left = withheld.filter((k) => k in body);
  if (left.length === 0) return { text, left };
  const kept = Object.fromEntries(Object.entries(body).filter(([k]) => !withheld.includes(k)));
  return { text: JSON.stringify(kept), left };
}
