import { consoleLog, levelOf } from "@benchwright/shared/contract/log";
import { readStoredSpec } from "@benchwright/shared/contract/run-spec";
import { WiringProof } from "@benchwright/shared/contract/wiring";
import { eq, sql } from "drizzle-orm";
import type { BrokerApi } from "../broker/interface";
import { brokerStub } from "../broker/sandbox-broker";
import { issueCapability, revokeRunCapabilities } from "../compute/capability";
import { loadConfig } from "../config";
import { randomId } from "../crypto/api-keys";
import { isDatabaseUnavailable, sqlState } from "../db/errors";
import { runs } from "../db/schema";
import type { Db } from "../db/types";
import { wakeNotifier } from "../notifications/notifier";
import { revokeEgressToken } from "../runs/egress-token";
import { issueProxyCredentials, revokeProxyCredentials } from "../runs/proxy-credentials";
import { runPolicyEnvelope } from "../runs/run-vault";
import * as runsService from "../runs/service";
import type { Transition } from "../runs/types";
import { relayStub } from "../tunnel/relay";
import { previewPolicy } from "../vault/policy";
import { brokerValue, type MachinePorts } from "./ports";

// The run machine's ports in the Worker (ports.ts): Postgres, the vault, the run's broker and its
// relay, for the coordinator's Durable Object (run-coordinator.ts).

/**
 * The machine's ports over Postgres, the vault and the broker. `requestId`: the API request
 * steering the run (its launch, or the cancel that ended it), named on every line the machine
 * logs and handed to the broker, whose lines name it too.
 */
export function workerPorts(env: Env, db: Db, requestId?: string): MachinePorts {
  const config = loadConfig(env);
  // The run's own broker instance for each call (a coordinator only ever asks about its run).
  const broker = (runId: string) => brokerStub(env, runId);
  // Its setup-image calls as the contract names them (interface.ts), whatever the class's own
  // signatures are while the broker's side is built.
  const images = (
    runId: string,
  ): Pick<BrokerApi, "claimSetupImage" | "captureSetupImage" | "releaseSetupImage"> => broker(runId);
  const environments = new Map<string, string>();
  const environmentOf = async (runId: string): Promise<string> => {
    const known = environments.get(runId);
    if (known) return known;
    const row = await runsService.loadRun(db, runId);
    if (!row) throw new Error(`no run ${runId}`);
    environments.set(runId, row.environmentId);
    return row.environmentId;
  };
  return {
    now: () => Date.now(),
    newId: (prefix) => randomId(prefix),
    loadRun: async (runId) => {
      const row = await runsService.loadRun(db, runId);
      return row ? { id: row.id, status: row.status, spec: readStoredSpec(row.spec) } : null;
    },
    transition: (runId, t) => endAware(env, db, runId, t),
    note: (runId, note) => runsService.addNote(db, runId, note),
    event: (runId, key, kind, detail) => runsService.addEvent(db, runId, key, kind, detail),
    setRunFields: (runId, fields) => runsService.setRunFields(db, runId, fields),
    log: (event) =>
      consoleLog(levelOf(event) === "info" ? "warn" : levelOf(event), {
        ...event,
        requestId: requestId ?? null,
      }),
    readVault: async (runId) => {
      try {
        // Bounded by the database itself: a read that waits longer (a lock, a slow compute) is
        // cancelled, the attempt fails and is retried, and the connection stays usable.
        return await db.transaction(async (tx) => {
          await tx.execute(
            sql`select set_config('statement_timeout', ${String(config.vaultReadTimeoutMs)}, true)`,
          );
          const row = await runsService.loadRun(tx, runId);
          if (!row) return { ok: false, reason: `no run ${runId}` };
          const read = await runPolicyEnvelope(tx, config.keyRing, row);
          return read.ok ? { ok: true, policy: read.value.policy } : { ok: false, reason: read.error.detail };
        });
      } catch (error) {
        return { ok: false, reason: databaseFault(error, config.vaultReadTimeoutMs) };
      }
    },
    issueProxyCredentials: async (runId) => {
      const row = await runsService.loadRun(db, runId);
      if (!row) throw new Error(`no run ${runId}`);
      return issueProxyCredentials(db, config.keyRing, row);
    },
    revokeProxyCredentials: (runId) => revokeProxyCredentials(db, runId),
    proxyReady: async (runId) => {
      const [row] = await db
        .select({ ca: runs.caCertPem, at: runs.proxyReadyAt })
        .from(runs)
        .where(eq(runs.id, runId));
      return row?.ca && row.at ? { caCertPem: row.ca } : null;
    },
    // The broker answers results (broker/interface.ts); the steps get each value, or its failure
    // thrown with the broker's code (ports.ts MachineBroker).
    broker: {
      create: (runId, request) => broker(runId).create(runId, request, requestId),
      exec: async (runId, sandboxId, request) =>
        brokerValue(await broker(runId).exec(runId, sandboxId, request)),
      poll: async (runId, sandboxId, execId, from) =>
        brokerValue(await broker(runId).poll(runId, sandboxId, execId, from)),
      kill: async (runId, sandboxId, execId) => {
        brokerValue(await broker(runId).kill(runId, sandboxId, execId));
      },
      freeze: async (runId, sandboxId, frozen) => {
        brokerValue(await broker(runId).freeze(runId, sandboxId, frozen));
      },
      destroyRun: async (runId, options) => {
        brokerValue(await broker(runId).destroyRun(runId, { ...options, requestId }));
      },
      destroy: async (runId, sandboxId) => {
        brokerValue(await broker(runId).destroySandbox(runId, sandboxId));
      },
      putBundle: async (runId, sandboxId, bundle) => {
        const environmentId = await environmentOf(runId);
        return brokerValue(await broker(runId).putBundle(runId, sandboxId, { environmentId, ...bundle }));
      },
      seal: async (runId, sandboxId, seal) => brokerValue(await broker(runId).seal(runId, sandboxId, seal)),
      setHosts: async (runId, sandboxId, hostsFile) => {
        brokerValue(await broker(runId).setHosts(runId, sandboxId, hostsFile));
      },
      collect: async (runId, sandboxId, options) => {
        const environmentId = await environmentOf(runId);
        return brokerValue(await broker(runId).collect(runId, sandboxId, { environmentId, ...options }));
      },
      claimSetupImage: (runId, sandboxId, request) =>
        images(runId).claimSetupImage(runId, sandboxId, request),
      captureSetupImage: (runId, sandboxId, key) => images(runId).captureSetupImage(runId, sandboxId, key),
      releaseSetupImage: async (runId, sandboxId, key) => {
        brokerValue(await images(runId).releaseSetupImage(runId, sandboxId, key));
      },
    },
    issueCapability: (runId, holderSandboxId) => issueCapability(db, runId, holderSandboxId),
    revokeCapabilities: (runId) => revokeRunCapabilities(db, runId),
    tunnelPaired: async (runId) => (await relayStub(env, runId).status()).paired,
    endTunnel: async (runId) => {
      await relayStub(env, runId).endRun();
      await revokeEgressToken(db, runId);
    },
    currentRouting: async (runId) => {
      const row = await runsService.loadRun(db, runId);
      if (!row) throw new Error(`no run ${runId}`);
      const { egress } = readStoredSpec(row.spec);
      const { routing, hostsFile } = await previewPolicy(db, row, { egress });
      return { routing, hostsFile };
    },
    parseProof: (stdout) => lastJsonLine(stdout, WiringProof),
  };
}

/**
 * Records a transition; when it ended the run, wakes the run's notifier, which sends what the
 * end owes (the transaction wrote the outbox rows).
 */
export async function endAware(env: Env, db: Db, runId: string, t: Transition): Promise<void> {
  if ((await runsService.recordTransition(db, runId, t)) && runsService.isTerminal(t.to)) {
    await wakeNotifier(env, runId);
  }
}

/**
 * Why a read failed, for the run's notes: the database's own timeout, a database that could not
 * be reached, or a failed query. Never the driver's message, which may name hosts.
 */
function databaseFault(error: unknown, timeoutMs: number): string {
  const code = sqlState(error);
  if (code === "57014") return `the database did not answer within ${timeoutMs / 1000} s`;
  if (isDatabaseUnavailable(error)) return "the database could not be reached";
  return code ? `the database failed the read (SQLSTATE ${code})` : "the read failed unexpectedly";
}

/** The last line a program printed, parsed as JSON with `shape`; null when it is not one. */
export function lastJsonLine<T>(
  stdout: string,
  shape: { safeParse(v: unknown): { success: true; data: T } | { success: false } },
): T | null {
  try {
    const parsed = shape.safeParse(JSON.parse(stdout.trim().split("\n").at(-1) ?? ""));
    return parsed.success ? parsed.data : null;
  } catch {
    return null;
  }
}
