import { parseHostPatternSyntax } from "./host-name";

// The operator's settings of where run-end notifications may go (NOTIFICATIONS_DENY_HOSTS,
// NOTIFICATIONS_ADMIT_LOOPBACK), as the Worker's configuration (src/config.ts) parses them.

/** Where run-end notifications may go (src/notifications/target.ts checks each URL against it). */
export interface TargetPolicy {
  /** The operator's deny list (NOTIFICATIONS_DENY_HOSTS): host patterns as the vault writes them. */
  readonly deny: readonly string[];
  /**
   * Test-only (NOTIFICATIONS_ADMIT_LOOPBACK): admits https://127.0.0.1:<port>, the suite's own
   * receiver, as the proxy's test CIDRs admit the suite's upstreams. Never set in a deployment.
   */
  readonly admitLoopback: boolean;
}

/**
 * The operator's deny list from its setting: comma- or space-separated host patterns. A pattern
 * that does not parse throws, naming it, so a typo fails the configuration check loudly instead
 * of denying nothing.
 */
export function parseDenyList(setting: string | undefined): string[] {
  const out: string[] = [];
  for (const item of (setting ?? "").split(/[\s,]+/)) {
    if (item === "") continue;
    const parsed = parseHostPatternSyntax(item);
    if (!parsed.ok)
      throw new Error(`NOTIFICATIONS_DENY_HOSTS: ${item} is not a host pattern (${parsed.message})`);
    out.push(parsed.pattern);
  }
  return out;
}
