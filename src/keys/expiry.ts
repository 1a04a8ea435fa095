import { fail, ok, type Result } from "../errors";

// When a new API key stops working: an instant (`expiresAt`) or a duration from now
// (`expiresIn`: a count and a unit, e.g. `90d`, `12h`, `30m`), or never. Plain TypeScript.

export const DURATION_PATTERN = /^([1-9][0-9]{0,5})([mhd])$/;
const UNIT_MS = { m: 60_000, h: 3_600_000, d: 86_400_000 } as const;
/** Far enough for any key worth an expiry; past it, leave the expiry out. */
export const MAX_KEY_LIFETIME_MS = 5 * 366 * 86_400_000;
/** A key that expires sooner would be gone before anyone could use it. */
export const MIN_KEY_LIFETIME_MS = 60_000;

export function resolveExpiry(
  input: { expiresAt?: string | undefined; expiresIn?: string | undefined },
  now: Date,
): Result<Date | null> {
  if (input.expiresAt !== undefined && input.expiresIn !== undefined) {
    return fail("invalid_expiry", "Give expiresAt or expiresIn, not both.");
  }
  let at: Date | null = null;
  if (input.expiresAt !== undefined) at = new Date(input.expiresAt);
  if (input.expiresIn !== undefined) {
    const m = DURATION_PATTERN.exec(input.expiresIn);
    if (!m) return fail("invalid_expiry", "expiresIn is a count and a unit: 30m, 12h, 90d.");
    at = new Date(now.getTime() + Number(m[1]) * UNIT_MS[m[2] as keyof typeof UNIT_MS]);
  }
  if (at === null) return ok(null);
  const lifetime = at.getTime() - now.getTime();
  if (Number.isNaN(lifetime) || lifetime < MIN_KEY_LIFETIME_MS) {
    return fail("invalid_expiry", "The expiry must be at least a minute from now.");
  }
  if (lifetime > MAX_KEY_LIFETIME_MS) {
    return fail(
      "invalid_expiry",
      "The expiry must be within five years; leave it out for a key that never expires.",
    );
  }
  return ok(at);
}
