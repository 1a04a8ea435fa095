/**
 * Whose data a service reads and writes: a user and one of their environments. Services take an
 * owner, not a `Principal` (src/context.ts), so the reaper, the coordinator, webhook deliveries
 * and a run's proxy reach them with the run's or the webhook's owner, without making up a key.
 */
export interface Owner {
  readonly userId: string;
  readonly environmentId: string;
}
