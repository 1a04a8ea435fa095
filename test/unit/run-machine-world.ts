import type { BrokerCode } from "@benchwright/shared/contract/broker";
import type { ExecInfo, SandboxInfo, Seal } from "@benchwright/shared/contract/local-agent";
import type { PolicyDocument } from "@benchwright/shared/contract/policy";
import type { RunSpec } from "@benchwright/shared/contract/run-spec";
import {
  type ImageDigest,
  SETUP_IMAGE_FORMAT,
  type SetupImageClaim,
  type SetupImageKey,
  setupImageKey,
} from "@benchwright/shared/contract/setup-image";
import type { WiringProof } from "@benchwright/shared/contract/wiring";
import { compilePolicy } from "@benchwright/shared/policy/compile";
import type { BrokerResult, SandboxRequest, SetupImageRequest } from "../../src/broker/interface";
import { RunMachine } from "../../src/coordinator/machine";
import { BrokerFailure, type MachinePorts } from "../../src/coordinator/ports";
import type { MachineState } from "../../src/coordinator/state";
import type { RunNote } from "../../src/runs/types";

// The in-memory world the run-machine tests drive the state machine over (run-machine*.test.ts).
// It behaves like the real ports do: creates and execs are idempotent by id (as the broker and
// host agent are), transitions by state (as the trace's unique key is). The end-to-end suite
// (test/e2e) runs the same machine on real parts; these enumerate crash points and faults that
// are hard to hit there.

export type Policy = PolicyDocument;
export const RULE_POLICY: Policy = compilePolicy({
  version: 3,
  default: "allow",
  hosts: [{ pattern: "blocked.example", action: "block" }],
  rules: [{ host: "api.example", secret: "KEY", inject: { scheme: "bearer", name: "authorization" } }],
});
export const CATCH_ALL_POLICY: Policy = compilePolicy({ version: 4, default: "block", hosts: [], rules: [] });
export const EMPTY_POLICY: Policy = compilePolicy({ version: 1, default: "allow", hosts: [], rules: [] });

/**
 * The broker's setup images of one environment, in memory, arbitrated as the broker's table does
 * (src/broker: one builder per key under a 120 s lease, first capture wins, a missing layer drops
 * its row). Worlds that share one are runs of the same environment.
 */
export class ImageTable {
  readonly rows = new Map<SetupImageKey, ImageRow>();
  /** Digests whose stored layer is gone (a create from them answers setup_image_missing). */
  readonly missing = new Set<string>();
  private builds = 0;

  /** A digest for the next capture. */
  nextDigest(): ImageDigest {
    this.builds += 1;
    return `sha256:${this.builds.toString(16).padStart(64, "0")}`;
  }
}

export interface ImageRow {
  status: "building" | "built";
  builderRunId: string | null;
  builderSandboxId: string | null;
  leaseUntil: number;
  digest: ImageDigest | null;
  builtByRunId: string | null;
}

export const LEASE_MS = 120_000;
const MIB = 1024 * 1024;

/** The key the fake broker computes for a claim (the real function, a fixed base). */
export function imageKey(request: Pick<SetupImageRequest, "setup" | "bundle" | "resources">) {
  return setupImageKey({
    format: SETUP_IMAGE_FORMAT,
    backend: "local",
    base: `sha256:${"b".repeat(64)}`,
    bundle: request.bundle,
    setup: request.setup,
    resources: { memoryMb: request.resources.memoryMb, pids: request.resources.pids },
  });
}

export const SPEC: RunSpec = {
  commands: ["echo one", "echo two"],
  egress: "direct",
  onProxyFailure: "stop",
};

export interface WorldOptions {
  spec?: RunSpec;
  policy?: Policy;
  vaultFailures?: number;
  createFails?: (kind: string) => string | null;
  proxyNeverReady?: boolean;
  proofOk?: boolean;
  exitCodes?: Record<string, number>;
  /** Throw from the named port this many times before behaving. */
  throwOnce?: { port: "create" | "exec" | "transition" | "destroy"; times: number };
  /** The run's status in the database when the coordinator loads it. */
  runStatus?: "queued" | "stopped";
  /** The routing the vault asks for when the run is resumed (default: the run's own). */
  routingNow?: Policy["routing"];
  lingerIdleMs?: number;
  /** Whether the relay has the run's proxy and egress agent paired, per look (default: never). */
  tunnelPaired?: (look: number) => boolean;
  /** Commands that keep running (never exit) while this says so. */
  keepsRunning?: (command: string) => boolean;
  /** Notes and events cannot be written while the vault reads fail (the database is away). */
  databaseAway?: boolean;
  /** The proxy's exec has exited (killed by this signal) from now on, per poll of it. */
  proxyDead?: (poll: number) => string | null;
  /** Whether the wiring proof of this exec id ("wiring" or "rewire") is ok (default: proofOk). */
  proofOkFor?: (execId: string) => boolean;
  /** Commands (setup or not) the kernel kills at a limit of their sandbox. */
  limits?: Record<string, "memory" | "pids">;
  /** The broker refuses the bundle with this. */
  bundleRefused?: { code: "bundle_path_traversal"; message: string };
  /** The backend cannot rewrite a running sandbox's hosts file. */
  setHostsUnsupported?: boolean;
  /** Every collect throws. */
  collectFails?: boolean;
  /** The backend cannot seal a setup stage (not_supported). */
  sealUnsupported?: boolean;
  /** The seal cannot end the setup stage (setup_not_sealed, case L7). */
  sealFails?: boolean;
  /** The run's id (default run_1). */
  runId?: string;
  /** The broker keeps setup images in this table; absent: every claim answers none (as today). */
  images?: ImageTable;
  /** Every capture is refused with this. */
  captureFails?: { code: BrokerCode; message: string };
  /** How long a sandbox waits for another run's build (default: the setting's default). */
  setupImageWaitMs?: number;
}

/** A broker failure as the broker's ports throw it (coordinator/worker-ports.ts). */
const brokerFailure = (code: "not_supported" | "setup_not_sealed", message: string) =>
  new BrokerFailure({ ok: false, code, message, retryable: false });

export function world(o: WorldOptions = {}) {
  let now = 1_000_000;
  let ids = 0;
  const runId = o.runId ?? "run_1";
  const saved: { state: MachineState | undefined } = { state: undefined };
  let alarm: number | null = null;
  let cancelKey: "cancelled" | "reaped" | null = null;
  let haltKey = false;
  let lingerKey: number | null = null;
  const routingOf = new Map<string, string | null>();
  const events = new Map<string, unknown>();
  const fields: Record<string, unknown>[] = [];
  const freezes: string[] = [];
  const transitions: { to: string; reason: string }[] = [];
  const notes: RunNote[] = [];
  const created = new Map<string, string>();
  const destroyed = new Set<string>();
  const execs = new Map<
    string,
    { argv: string[]; stage: string; env: Record<string, string>; stdin?: string | undefined }
  >();
  /** Every stage's broker call, in order: `<sandbox>:<what>` (exec starts, bundle, seal, collect, destroy). */
  const order: string[] = [];
  const seals: { sandboxId: string; seal: Seal }[] = [];
  const hostsSet: { sandboxId: string; hostsFile: string[] }[] = [];
  const collects: string[] = [];
  const createRequests: SandboxRequest[] = [];
  /** Setup-image calls: claims (with the answer), captures and releases, by sandbox. */
  const claims: { sandboxId: string; mode: string; claim: SetupImageClaim }[] = [];
  const captures: string[] = [];
  const releases: string[] = [];
  const ok = <T>(value: T): BrokerResult<T> => ({ ok: true, value });
  const refused = (code: BrokerCode, message: string) => ({
    ok: false as const,
    code,
    message,
    retryable: false,
  });
  /** A create from a setup image: refused unless its key is built and its layer is there. */
  const fromImage = (key: SetupImageKey) => {
    const row = o.images?.rows.get(key);
    if (row?.status !== "built" || !row.digest)
      return refused("setup_image_not_found", `no setup image ${key}`);
    if (o.images?.missing.has(row.digest)) {
      o.images.rows.delete(key);
      return refused("setup_image_missing", `no complete layer ${row.digest}`);
    }
    return null;
  };
  let vaultHosts: string[] | null = null;
  const starts: string[] = [];
  const kills: string[] = [];
  let revocations = 0;
  const capabilities: string[] = [];
  const destroyedEarly: string[] = [];
  let capabilityRevocations = 0;
  let tunnelLooks = 0;
  let tunnelEnds = 0;
  let vaultReads = 0;
  let proxyStarted = false;
  let proxyPolls = 0;
  const proxyPollRanges: { stdoutFrom?: number; stderrFrom?: number }[] = [];
  let throws = o.throwOnce?.times ?? 0;
  const maybeThrow = (port: string) => {
    if (o.throwOnce?.port === port && throws > 0) {
      throws -= 1;
      throw new Error(`${port} unavailable`);
    }
  };
  const info = (sandboxId: string, execId: string, exitCode: number | null, stdout = ""): ExecInfo => ({
    execId,
    sandboxId,
    state: exitCode === null ? "running" : "exited",
    exitCode,
    signal: null,
    stdout,
    stderr: "",
    stdoutEnd: stdout.length,
    stderrEnd: 0,
  });
  const proof = (ok: boolean): WiringProof => ({
    ok,
    mode: "default",
    caFingerprint256: "a".repeat(64),
    hostsEntries: ["10.0.0.1 api.example"],
    probes: [{ name: "tls_probe", expected: "403", observed: ok ? "403" : "200", ok }],
    env: {
      NODE_EXTRA_CA_CERTS: "/run/benchwright/run-ca.pem",
      REQUESTS_CA_BUNDLE: "/etc/ssl/certs/ca-certificates.crt",
      SSL_CERT_FILE: "/etc/ssl/certs/ca-certificates.crt",
      CURL_CA_BUNDLE: "/etc/ssl/certs/ca-certificates.crt",
    },
  });
  const logs: Record<string, unknown>[] = [];
  const away = () => o.databaseAway === true && vaultReads <= (o.vaultFailures ?? 0);
  const ports: MachinePorts = {
    now: () => now,
    log: (event) => logs.push(event),
    newId: (prefix) => `${prefix}${++ids}`,
    loadRun: async (id) => ({ id, status: o.runStatus ?? "queued", spec: o.spec ?? SPEC }),
    transition: async (_runId, t) => {
      maybeThrow("transition");
      if (!transitions.some((x) => x.to === t.to)) transitions.push({ to: t.to, reason: t.reason });
    },
    note: async (_runId, note) => {
      if (away()) throw new Error("database away");
      if (!notes.some((n) => n.code === note.code)) notes.push(note);
    },
    event: async (_runId, key, _kind, detail) => {
      if (away()) throw new Error("database away");
      if (!events.has(key)) events.set(key, detail);
    },
    setRunFields: async (_runId, f) => {
      fields.push(f);
    },
    readVault: async () => {
      vaultReads += 1;
      if (vaultReads <= (o.vaultFailures ?? 0)) return { ok: false, reason: "the database did not answer" };
      return { ok: true, policy: o.policy ?? RULE_POLICY };
    },
    issueProxyCredentials: async () => ({ proxyToken: "t".repeat(40), auditKey: "whsec_x" }),
    revokeProxyCredentials: async () => {
      revocations += 1;
    },
    proxyReady: async () => (proxyStarted && !o.proxyNeverReady ? { caCertPem: "CA" } : null),
    broker: {
      create: async (_runId, req) => {
        maybeThrow("create");
        const failure = o.createFails?.(req.kind === "proxy" ? "proxy" : `${req.kind}:${req.routing}`);
        if (failure) return { ok: false, code: "sandbox_failed", message: failure, retryable: false };
        const image = req.kind !== "proxy" && req.setupImage ? fromImage(req.setupImage.key) : null;
        if (image) return image;
        created.set(req.id, req.kind);
        createRequests.push(req);
        routingOf.set(req.id, req.kind === "proxy" ? null : req.routing);
        const sandbox: SandboxInfo = {
          id: req.id,
          runId,
          kind: req.kind,
          state: "ready",
          address: "10.0.0.2",
          proxyAddress: req.kind === "proxy" ? null : "10.0.0.1",
          controlPlaneUrl: null,
          routing: req.kind === "proxy" ? null : req.routing,
          probeTarget: req.kind === "proxy" ? null : "10.9.0.1:9",
          wiring: null,
        };
        return { ok: true, value: sandbox };
      },
      exec: async (_runId, sandboxId, req) => {
        maybeThrow("exec");
        const key = `${sandboxId}/${req.id}`;
        if (!execs.has(key)) {
          execs.set(key, { argv: req.argv, stage: req.stage, env: req.env, stdin: req.stdin });
          starts.push(key);
          order.push(`${sandboxId}:${req.id}`);
          if (req.argv[0] === "bw-proxy") proxyStarted = true;
        }
        return info(sandboxId, req.id, null);
      },
      poll: async (_runId, sandboxId, execId, range) => {
        const e = execs.get(`${sandboxId}/${execId}`);
        if (!e) throw new Error("no such exec");
        if (e.argv[0] === "bw-proxy") {
          proxyPolls += 1;
          proxyPollRanges.push({ stdoutFrom: range?.stdoutFrom, stderrFrom: range?.stderrFrom });
          const signal = o.proxyDead?.(proxyPolls) ?? null;
          const base = info(sandboxId, execId, null, "proxy: listening\n");
          return signal
            ? { ...base, state: "exited", signal, stderr: "proxy: out of memory\n", stderrEnd: 21 }
            : base;
        }
        if (e.argv[0] === "bw-wiring")
          return info(
            sandboxId,
            execId,
            0,
            JSON.stringify(proof(o.proofOkFor?.(execId) ?? o.proofOk ?? true)),
          );
        if (e.argv[0] === "sh" && o.keepsRunning?.(e.argv[2] ?? "")) return info(sandboxId, execId, null);
        const limit = o.limits?.[e.argv[2] ?? ""];
        if (limit) return { ...info(sandboxId, execId, null), state: "exited", signal: "SIGKILL", limit };
        return info(sandboxId, execId, o.exitCodes?.[e.argv[2] ?? ""] ?? 0, `${e.argv[2]}\n`);
      },
      kill: async (_runId, sandboxId, execId) => {
        kills.push(`${sandboxId}/${execId}`);
      },
      freeze: async (_runId, sandboxId, frozen) => {
        freezes.push(`${frozen ? "stop" : "cont"}:${sandboxId}`);
      },
      destroyRun: async (_runId, options) => {
        maybeThrow("destroy");
        for (const [id, kind] of created) if (!(options?.keepProxy && kind === "proxy")) destroyed.add(id);
      },
      destroy: async (_runId, sandboxId) => {
        maybeThrow("destroy");
        destroyed.add(sandboxId);
        destroyedEarly.push(sandboxId);
        order.push(`${sandboxId}:destroy`);
      },
      putBundle: async (_runId, sandboxId, bundle) => {
        order.push(`${sandboxId}:bundle:${bundle.sha256.slice(0, 4)}:${bundle.dir}`);
        return o.bundleRefused ? { ok: false, ...o.bundleRefused } : { ok: true, files: 3, bytes: 120 };
      },
      seal: async (_runId, sandboxId, seal) => {
        order.push(`${sandboxId}:seal`);
        if (o.sealUnsupported)
          throw brokerFailure("not_supported", "seal is not yet built for the e2b backend");
        if (o.sealFails)
          throw brokerFailure("setup_not_sealed", "3 process(es) of the setup stage are still running");
        seals.push({ sandboxId, seal });
        return { killed: 2 };
      },
      setHosts: async (_runId, sandboxId, hostsFile) => {
        if (o.setHostsUnsupported) throw brokerFailure("not_supported", "no hosts rewrite here");
        hostsSet.push({ sandboxId, hostsFile });
      },
      collect: async (_runId, sandboxId) => {
        order.push(`${sandboxId}:collect`);
        collects.push(sandboxId);
        if (o.collectFails) throw new Error("collect failed");
        return { files: 1, bytes: 10, cut: 0 };
      },
      claimSetupImage: async (claimRunId, sandboxId, req) => {
        const claim = await claimOf(claimRunId, sandboxId, req);
        claims.push({ sandboxId, mode: req.mode, claim });
        return ok(claim);
      },
      captureSetupImage: async (captureRunId, sandboxId, key) => {
        order.push(`${sandboxId}:capture`);
        if (o.captureFails) return refused(o.captureFails.code, o.captureFails.message);
        const row = o.images?.rows.get(key);
        if (!o.images || row?.builderSandboxId !== sandboxId)
          return refused("setup_image_not_found", "not its build");
        const digest = o.images.nextDigest();
        Object.assign(row, {
          status: "built",
          digest,
          builtByRunId: captureRunId,
          builderRunId: null,
          builderSandboxId: null,
        });
        captures.push(sandboxId);
        return ok({ digest, bytes: 3 * MIB, files: 42 });
      },
      releaseSetupImage: async (_runId, sandboxId, key) => {
        releases.push(sandboxId);
        const row = o.images?.rows.get(key);
        if (row?.builderSandboxId !== sandboxId) return;
        if (row.status === "building") o.images?.rows.delete(key);
        else Object.assign(row, { builderRunId: null, builderSandboxId: null });
      },
    },
    issueCapability: async (_runId, holder) => {
      capabilities.push(holder);
      return { token: `bwc_${holder}_${capabilities.length}` };
    },
    revokeCapabilities: async () => {
      capabilityRevocations += 1;
    },
    tunnelPaired: async () => {
      tunnelLooks += 1;
      return o.tunnelPaired?.(tunnelLooks) ?? false;
    },
    endTunnel: async () => {
      tunnelEnds += 1;
    },
    parseProof: (stdout) => JSON.parse(stdout) as WiringProof,
    currentRouting: async () => ({
      routing: o.routingNow ?? (o.policy ?? RULE_POLICY).routing,
      hostsFile: vaultHosts ?? (o.policy ?? RULE_POLICY).hostsFile,
    }),
  };
  /** The broker's answer to a claim, over the table (as the broker's conditional upsert). */
  async function claimOf(
    claimRunId: string,
    sandboxId: string,
    req: SetupImageRequest,
  ): Promise<SetupImageClaim> {
    const table = o.images;
    if (!table) return { role: "none", reason: "setup images are not kept here" };
    const key = await imageKey(req);
    const row = table.rows.get(key);
    const lease = { builderRunId: claimRunId, builderSandboxId: sandboxId, leaseUntil: now + LEASE_MS };
    if (!row) {
      table.rows.set(key, { status: "building", digest: null, builtByRunId: null, ...lease });
      return { role: "build", key };
    }
    const free = row.builderSandboxId === null || row.builderSandboxId === sandboxId || row.leaseUntil < now;
    if (free && (row.status === "building" || req.mode === "rebuild" || row.builderSandboxId === sandboxId)) {
      Object.assign(row, lease);
      return { role: "build", key };
    }
    if (row.status === "building" || !row.digest)
      return { role: "wait", key, builderRunId: row.builderRunId };
    return {
      role: "use",
      key,
      digest: row.digest,
      builtByRunId: row.builtByRunId,
      builtAt: new Date(0).toISOString(),
    };
  }

  /** `crashAt`: drop the end-of-step save of the n-th step (as if the isolate died there). */
  let crashAt = new Set<number>();
  let steps = 0;
  const storage = {
    load: async () => (saved.state ? structuredClone(saved.state) : undefined),
    save: async (state: MachineState) => {
      saved.state = structuredClone(state);
    },
    setAlarm: async (at: number) => {
      alarm = at;
    },
    requestCancel: async (reason: "cancelled" | "reaped") => {
      cancelKey = reason;
    },
    cancelRequested: async () => cancelKey,
    requestHalt: async (halt: boolean) => {
      haltKey = halt;
    },
    haltRequested: async () => haltKey,
    requestLinger: async (seconds: number) => {
      lingerKey = seconds;
    },
    lingerRequested: async () => lingerKey,
  };
  const machine = new RunMachine(storage, ports, {
    lingerIdleMs: o.lingerIdleMs ?? 60_000,
    ...(o.setupImageWaitMs === undefined ? {} : { setupImageWaitMs: o.setupImageWaitMs }),
  });
  return {
    machine,
    transitions,
    notes,
    created,
    destroyed,
    execs,
    starts,
    kills,
    freezes,
    routingOf,
    events,
    fields,
    logs,
    order,
    seals,
    hostsSet,
    collects,
    createRequests,
    claims,
    captures,
    releases,
    /** The vault is edited: from now on its hosts file is this. */
    setVaultHosts: (hosts: string[]) => {
      vaultHosts = hosts;
    },
    revocations: () => revocations,
    capabilities,
    destroyedEarly,
    capabilityRevocations: () => capabilityRevocations,
    tunnelLooks: () => tunnelLooks,
    tunnelEnds: () => tunnelEnds,
    proxyPolls: () => proxyPolls,
    proxyPollRanges,
    now: () => now,
    alarm: () => alarm,
    /** The vault is edited: from now on it asks for this routing. */
    setRouting: (routing: Policy["routing"]) => {
      o.routingNow = routing;
    },
    crashAt: (...n: number[]) => {
      crashAt = new Set(n);
    },
    state: () => saved.state,
    steps: () => steps,
    /** Fires the pending alarm once, the clock advanced to it (never slept). */
    async next() {
      if (alarm === null) throw new Error("no alarm pending");
      now = Math.max(now, alarm);
      alarm = null;
      steps += 1;
      await machine.step();
    },
    /** Runs alarms until the run is over (or `max` steps), advancing the clock to each alarm. */
    async drive(max = 200) {
      await machine.start(runId);
      while (alarm !== null && steps < max) {
        now = Math.max(now, alarm);
        alarm = null;
        steps += 1;
        if (crashAt.has(steps)) {
          const before = saved.state ? structuredClone(saved.state) : undefined;
          const checkpointsKept = { value: before };
          const realSave = storage.save;
          // Mid-step checkpoints are kept; only the final save and the alarm are lost.
          let last: MachineState | undefined;
          storage.save = async (s) => {
            if (last) checkpointsKept.value = last;
            last = structuredClone(s);
          };
          await machine.step();
          storage.save = realSave;
          saved.state = checkpointsKept.value;
          alarm = now + 1; // the runtime retries the alarm
          continue;
        }
        await machine.step();
      }
      return saved.state;
    },
  };
}

export const states = (w: ReturnType<typeof world>) => w.transitions.map((t) => t.to);
