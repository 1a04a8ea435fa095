import type { PolicyDocument } from "@benchwright/shared/contract/policy";
import { BrokerFailure, type Machine } from "../ports";
import type { MachineState, Worker } from "../state";
import { must, proxyRuns } from "./common";

// Vault edits while the run runs (or is halted). The proxy picks up every edit by itself; under
// default routing a sandbox sends to the proxy only the names in its hosts file, so an exact
// block or rule added mid-run must reach the running sandboxes' hosts files too: rewritten from
// outside through the broker, or, where a backend cannot, said on the run. A change of routing
// mode (default → catch-all) cannot be put onto a running sandbox at all: said on the run.

/** How often a running (or halted) run compares the vault's hosts file with its sandboxes'. */
export const HOSTS_CHECK_MS = 5_000;

const installed = (s: MachineState, w: Worker) => w.hostsFile ?? must(s.policy).hostsFile;
const routingOf = (s: MachineState, w: Worker) => w.routing ?? must(s.policy).routing.mode;

function same(a: readonly string[], b: readonly string[]): boolean {
  const x = [...a].sort();
  const y = [...b].sort();
  return x.length === y.length && x.every((h, i) => h === y[i]);
}

function describeEdit(before: readonly string[], after: readonly string[]): string {
  const added = after.filter((h) => !before.includes(h));
  const removed = before.filter((h) => !after.includes(h));
  return [
    added.length > 0 ? `added ${added.join(", ")}` : null,
    removed.length > 0 ? `removed ${removed.join(", ")}` : null,
  ]
    .filter(Boolean)
    .join("; ");
}

/** Every HOSTS_CHECK_MS: the vault's hosts file now, put onto each live default-routing sandbox. */
export async function syncHosts(m: Machine, s: MachineState): Promise<void> {
  if (!proxyRuns(s)) return;
  const now = m.ports.now();
  if (s.hostsCheckedAt !== null && now - s.hostsCheckedAt < HOSTS_CHECK_MS) return;
  s.hostsCheckedAt = now;
  // Wired and not done: a sandbox still being wired gets what its wiring installs, then the next look.
  const live = s.workers.filter(
    (w) => !w.done && !w.destroyed && w.env !== null && routingOf(s, w) === "default",
  );
  if (live.length === 0) return;
  const current = await m.ports.currentRouting(s.runId);
  if (current.routing.mode !== "default") {
    // Under catch-all the vault has no hosts file to give: the running sandboxes keep theirs.
    await retrofitCheck(m, s, current.routing);
    return;
  }
  const stale = live.filter((w) => !w.hostsFixed && !same(installed(s, w), current.hostsFile));
  if (stale.length === 0) return;
  const edit = s.hostsEdits + 1;
  s.hostsEdits = edit;
  const unreached: { w: Worker; what: string }[] = [];
  for (const w of stale) {
    const what = describeEdit(installed(s, w), current.hostsFile);
    try {
      await m.ports.broker.setHosts(s.runId, w.sandboxId, current.hostsFile);
    } catch (error) {
      if (!(error instanceof BrokerFailure && error.code === "not_supported")) {
        // Kept as it is: the next look tries again.
        m.ports.log({ event: "set_hosts_failed", runId: s.runId, sandboxId: w.sandboxId });
        continue;
      }
      w.hostsFixed = true;
      unreached.push({ w, what });
      await m.ports.event(s.runId, `hosts:${edit}:${w.sandboxId}`, "note", {
        sandbox: w.sandboxId,
        name: w.name,
        reached: false,
        text: `A vault edit (hosts ${what}) did not reach ${w.name}: its backend cannot rewrite a running sandbox's hosts file.`,
      });
      continue;
    }
    w.hostsFile = [...current.hostsFile];
    await m.ports.event(s.runId, `hosts:${edit}:${w.sandboxId}`, "note", {
      sandbox: w.sandboxId,
      name: w.name,
      reached: true,
      hostsFile: w.hostsFile,
      text: `A vault edit reached ${w.name}'s hosts file (hosts ${what}).`,
    });
  }
  if (unreached.length > 0) {
    await m.ports.note(s.runId, {
      level: "warning",
      code: "hosts_edit_not_applied",
      text: `A vault edit made while the run runs (hosts ${unreached[0]?.what}) did not reach ${unreached.map((u) => u.w.name).join(", ")}: this backend cannot rewrite a running sandbox's hosts file, so there those hosts are not sent through the proxy (nor later edits; the trace lists each). The proxy itself has every edit. Relaunch the run to have them everywhere.`,
    });
  }
}

/**
 * Routing is installed when a sandbox is made; an edit that needs catch-all (a block default,
 * a wildcard block, ...) cannot be put onto sandboxes that run under default routing. Say so
 * (once: the note stays on the run).
 */
export async function retrofitCheck(
  m: Machine,
  s: MachineState,
  known?: PolicyDocument["routing"],
): Promise<void> {
  if (s.routingNoted) return;
  const installedMode = s.policy?.routing.mode;
  if (installedMode !== "default") return;
  const now = known ?? (await m.ports.currentRouting(s.runId)).routing;
  if (now.mode !== "catch-all") return;
  const later = s.workers.some((w) => w.proxyAddress === null)
    ? " Task sandboxes made from now on (tasks still waiting for their turn) get catch-all routing."
    : "";
  await m.ports.note(s.runId, {
    level: "warning",
    code: "routing_change_not_retrofitted",
    text: `The vault now needs catch-all routing (${now.reasons.join(", ")}), which cannot be installed on this run's running sandboxes: they keep default routing, so only the hosts in their hosts file go through the proxy. Relaunch the run to get catch-all routing.${later}`,
  });
  s.routingNoted = true;
}
