import { placeholderEnvs } from "@benchwright/shared/contract/placeholder";
import { isTerminal } from "@benchwright/shared/contract/run-states";
import type { Machine } from "../ports";
import type { MachineState } from "../state";
import { move, stop } from "./common";

// queued → fetching_vault → starting_proxy: the run's row is read, then its vault (retried with
// backoff; a vault that stays unreadable stops the run before any sandbox is made).

export const VAULT_ATTEMPTS = 4;
export const VAULT_BACKOFF_MS = 500;

export async function enterQueued(m: Machine, s: MachineState): Promise<number> {
  const run = await m.ports.loadRun(s.runId);
  if (!run) {
    s.state = "failed"; // no row: nothing to record it on
    return m.ports.now();
  }
  if (isTerminal(run.status)) {
    s.state = run.status; // ended before it started (cancelled): never start it now
    return m.ports.now();
  }
  s.spec = run.spec;
  await move(m, s, "fetching_vault", "started");
  return m.ports.now();
}

export async function fetchVault(m: Machine, s: MachineState): Promise<number> {
  const read = await m.ports.readVault(s.runId);
  if (!read.ok) {
    s.attempt += 1;
    const text = `Vault read attempt ${s.attempt} of ${VAULT_ATTEMPTS} failed: ${read.reason}`;
    // The database may be the very thing that is away: the attempt counts even when its note
    // cannot be written, and the Worker's log has it either way.
    m.ports.log({
      event: "vault_read_failed",
      runId: s.runId,
      attempt: s.attempt,
      of: VAULT_ATTEMPTS,
      reason: read.reason,
    });
    await m.ports.event(s.runId, `vault:${s.attempt}`, "note", { text }).catch(() => {});
    if (s.attempt >= VAULT_ATTEMPTS) {
      await m.ports
        .note(s.runId, {
          level: "warning",
          code: "vault_unreadable",
          text: `The vault could not be read after ${VAULT_ATTEMPTS} tries (${read.reason}), so the run stopped before any sandbox was made and no benchmark code ran.`,
        })
        .catch(() => {});
      // The stop is recorded by the teardown, which retries until the database answers.
      return stop(
        m,
        s,
        "vault_unreadable",
        `The vault could not be read (${read.reason}); no benchmark code ran.`,
      );
    }
    return m.ports.now() + VAULT_BACKOFF_MS * 2 ** (s.attempt - 1);
  }
  // The Harbor bridge's orchestrator reaches the compute API through the run's proxy, so a
  // Harbor run always has one, even when the vault gives it nothing to enforce.
  const p =
    s.spec?.orchestrator === "harbor" && !read.policy.enforce
      ? { ...read.policy, enforce: true, note: null }
      : read.policy;
  s.policy = {
    version: p.version,
    routing: p.routing,
    enforce: p.enforce,
    hostsFile: p.hostsFile,
    note: p.note,
    model: p.model ? { name: p.model.name, provider: p.model.provider } : null,
    placeholders: placeholderEnvs(p.rules, p.model !== null),
  };
  await m.ports.setRunFields(s.runId, { routing: p.routing.mode, policyVersion: p.version });
  if (p.routing.mode === "catch-all") {
    await m.ports.note(s.runId, {
      level: "note",
      code: "catch_all_routing",
      text: `Every connection on ports 80 and 443 goes through the run's proxy and nothing else leaves (${p.routing.reasons.join(", ")}).`,
    });
  }
  if (!p.enforce) {
    await m.ports.note(s.runId, {
      level: "note",
      code: "no_proxy",
      text: p.note ?? "This run goes without a proxy.",
    });
  }
  await move(m, s, "starting_proxy", p.enforce ? "vault_read" : "nothing_to_enforce");
  return m.ports.now();
}
