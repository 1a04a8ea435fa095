import { z } from "zod";

// One contract for every paginated list of the API (issue 36, case O3): one limit range, one
// default, one cursor form. A cursor is `<body>.<mac>`: the body is base64url JSON naming the
// list, the environment and the last row's key; the mac is the Worker's keyed digest of the body
// (src/lists/cursor.ts). A cursor that was tampered with, that another list or another
// environment gave, is refused with 400 `invalid_cursor`, never read as a position.

export const LIST_LIMIT = { min: 1, max: 200, default: 50 } as const;

/** Longest cursor a list accepts: a body of a few keys and its mac fit well within it. */
export const CURSOR_MAX_LENGTH = 1024;

/** Every list that pages with a cursor; a cursor names one of them and is read by it alone. */
export const LIST_NAMES = [
  "runs",
  "run-blocked-hosts",
  "run-egress-routes",
  "run-limit-refusals",
  "run-stray-placeholders",
  "run-model-calls",
  "run-bug-reports",
  "blocked-hosts",
  "setup-images",
  "api-keys",
  "notifications",
  "notification-deliveries",
] as const;
export type ListName = (typeof LIST_NAMES)[number];

/** A cursor's body, before it is sealed: which list, which environment, the last row's key. */
export const CursorBody = z
  .object({
    list: z.enum(LIST_NAMES),
    env: z.string().min(1).max(64),
    key: z
      .array(z.union([z.string().max(1024), z.number()]))
      .min(1)
      .max(8),
  })
  .strict();
export type CursorBody = z.infer<typeof CursorBody>;
