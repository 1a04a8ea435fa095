/**
 * Polls `probe` until it returns something truthy and returns that; fails after `deadlineMs`.
 * Tests wait on a condition with a deadline, never on a fixed sleep.
 */
export async function until<T>(
  what: string,
  probe: () => T | Promise<T>,
  deadlineMs = 10_000,
  everyMs = 50,
): Promise<NonNullable<T>> {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const value = await probe();
    if (value) return value as NonNullable<T>;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
