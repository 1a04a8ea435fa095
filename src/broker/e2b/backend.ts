import {
  ARTIFACT_DEFAULTS,
  BUNDLE_DEFAULTS,
  UNPACK_EXIT,
  UnpackResult,
} from "@benchwright/shared/contract/bundle";
import {
  killArgs,
  lastJson,
  pollArgs,
  RunnerSeal,
  sealArgs,
  startInlineArgs,
  toExecInfo,
} from "@benchwright/shared/contract/exec-runner";
import {
  type ExecInfo,
  ExecRequest,
  type SandboxInfo,
  SandboxKind,
  Seal,
  type SealResult,
} from "@benchwright/shared/contract/local-agent";
import type { RoutingMode } from "@benchwright/shared/contract/policy";
import { type SandboxInfo as E2bSandboxInfo, Sandbox } from "e2b";
import { BackendError, type ComputeBackend, type ExecPoll, type SandboxSpec } from "../backend";
import { type RegistryEnv, registryFromEnv, type SetupRegistry } from "../registry-images";
import {
  E2bEnv,
  MAX_POLL_WAIT_MS,
  META,
  RUNNER_DEADLINE_MS,
  TRANSFER_DEADLINE_MS,
  WORK_PROXY_ADDRESS,
} from "./config";
import { BRIDGE_PORT, networkDrift, proxyNetwork, workNetwork } from "./network";
import { e2bSandboxes, held, type Meta } from "./sandboxes";
import { e2bSetupImages } from "./setup-images";
import { runnerCommand } from "./shell";
import { collectArgv, EXECUTE_USER, resourcesMisfit, TRANSFER_DIR, unpackArgv } from "./stages";

// The `e2b` backend: one E2B microVM per sandbox, through E2B's `e2b` SDK, from the SandboxBroker
// Durable Object (the SDK runs in workerd with nodejs_compat). docs/e2b.md says what it makes,
// what it guarantees and how to set it up; in short:
//
// - proxy sandbox: the proxy template, public traffic off; `bw-bridge serve` is started in it at
//   create, the only way in for the run's work sandboxes. The proxy process (`bw-proxy`) gets the
//   run's proxy credentials as that one process's environment, never as sandbox settings.
// - work/task/orchestrator: the work template, public traffic off; catch-all routing is E2B's
//   firewall (deny everything but the proxy's bridge host), checked after create. In each, the
//   backend starts `bw-bridge connect` (root) so that 127.0.0.1:443/80 lead to the proxy, and
//   under catch-all installs the redirect of every 80/443 connection to it. Setup-stage execs
//   run as root, execute-stage ones as `user`, who must not be able to become root (checked).
// - the two stages (stages.ts): setup-stage commands run in the runner's setup cgroup, and
//   seal kills all they left, takes root away again and writes the wiring again from the
//   control plane's copy; bundles go in and artifacts come out through envd's files API, as
//   `user`. A run's resources must fit the template's size; its pids bound every execute command.
// - every exec goes through the templates' runner `bw-exec`, which keeps output and exit status
//   in the sandbox (E2B keeps none) and makes a start idempotent by its exec id.
// - freeze is E2B's pause (memory kept) and connect (resume); destroy is kill; list is by
//   metadata. Sandboxes time out into pause, never into loss.

/** The e2b backend from the Worker's env; the reason it is not configured otherwise. */
export function e2bFromEnv(
  env: Record<
    "PUBLIC_URL" | "E2B_PROXY_TEMPLATE" | "E2B_WORK_TEMPLATE" | "E2B_API_URL" | "E2B_DOMAIN",
    unknown
  > & {
    E2B_API_KEY?: unknown;
    E2B_SANDBOX_URL?: unknown;
    E2B_WORK_IMAGE?: unknown;
  } & RegistryEnv,
): ComputeBackend | string {
  const parsed = E2bEnv.safeParse(env);
  if (!parsed.success) return [...new Set(parsed.error.issues.map((i) => i.message))].join("; ");
  return e2bBackend(parsed.data, registryFromEnv(env));
}

export function e2bBackend(
  config: E2bEnv,
  registry: SetupRegistry = { settings: async () => null, signingKeyText: "" },
): ComputeBackend {
  const box = e2bSandboxes(config);
  const images = e2bSetupImages(config, registry, box);

  return {
    name: "e2b",

    async create(spec: SandboxSpec): Promise<SandboxInfo> {
      const meta: Meta = {
        [META.deployment]: box.deployment,
        [META.run]: spec.runId,
        [META.kind]: spec.kind,
        [META.sandbox]: spec.id,
      };
      if (spec.kind === "proxy") {
        const network = proxyNetwork();
        const h = await box.ensureSandbox(spec.id, config.E2B_PROXY_TEMPLATE, meta, network);
        const info = await box.call("read the sandbox", () => Sandbox.getInfo(h.e2bId, box.opts));
        const drift = networkDrift(network, info.network);
        if (drift.length > 0) {
          throw new BackendError(
            "cannot_isolate",
            `E2B does not keep the proxy sandbox private (${drift.join("; ")})`,
          );
        }
        const token = await box.bridgeToken(spec.id);
        box.hide([config.E2B_API_KEY, token]);
        await box.startService(
          spec.id,
          ["bw-bridge", "serve"],
          { BW_BRIDGE_TOKEN: token, BW_BRIDGE_PORT: String(BRIDGE_PORT) },
          "user",
          "start the bridge's proxy end",
        );
        return {
          id: spec.id,
          runId: spec.runId,
          kind: "proxy",
          state: "ready",
          address: h.e2bId,
          proxyAddress: null,
          controlPlaneUrl: config.PUBLIC_URL,
          routing: null,
          probeTarget: null,
          wiring: null,
        };
      }

      const { proxy, host } = await box.proxyOf(spec);
      const network = workNetwork(spec.routing, host);
      // A setup image's sandbox starts from its template (built at capture), nothing else.
      const template = spec.layer ? await images.startFrom(spec.layer) : config.E2B_WORK_TEMPLATE;
      const h = await box
        .ensureSandbox(
          spec.id,
          template,
          {
            ...meta,
            [META.proxy]: spec.proxySandboxId,
            [META.routing]: spec.routing,
            ...(spec.resources ? { [META.pids]: String(spec.resources.pids) } : {}),
            ...(spec.capture ? { [META.capture]: "true" } : {}),
          },
          network,
        )
        .catch((e) => {
          if (spec.layer && e instanceof BackendError && e.code === "not_found") {
            throw new BackendError(
              "setup_image_missing",
              `E2B has no template of setup image ${spec.layer.digest}`,
            );
          }
          throw e;
        });
      const made = await box.ensureNetwork(spec.id, h.e2bId, network);
      // E2B sizes a sandbox by its template: a run that needs more is refused, not shrunk.
      const misfit = spec.resources ? resourcesMisfit(spec.resources, made, template) : null;
      if (misfit) throw new BackendError("resources_unavailable", misfit);
      // The execute stage's user must not become root: root could undo the hosts file. E2B's
      // template build gives `user` sudo after the Dockerfile ran, so it is taken away here, in
      // each sandbox, then checked as that user.
      await box.takeRootAway(spec.id);
      // The working directory of every backend ($BW_OUT is under it), the execute user's.
      const workdir = await box.call("make the working directory", () =>
        box.withSandbox(spec.id, (s) =>
          box.run(s, "bw-workdir", { user: "root", timeoutMs: RUNNER_DEADLINE_MS }),
        ),
      );
      if (workdir.exitCode !== 0) {
        throw new BackendError(
          "sandbox_failed",
          `the working directory could not be made: ${box.scrub(box.lastLine(workdir.stderr))}`,
        );
      }
      const token = await box.bridgeToken(spec.proxySandboxId);
      const edge = proxy.sandbox.trafficAccessToken ?? "";
      box.hide([config.E2B_API_KEY, token, edge]);
      await box.startService(
        spec.id,
        ["bw-bridge", "connect"],
        {
          BW_BRIDGE_URL: `https://${host}`,
          BW_BRIDGE_TOKEN: token,
          ...(edge ? { BW_BRIDGE_EDGE_TOKEN: edge } : {}),
          BW_BRIDGE_LISTEN: WORK_PROXY_ADDRESS,
        },
        "root",
        "start the bridge to the proxy",
      );
      if (spec.routing === "catch-all") await box.installRedirect(spec.id);
      return {
        id: spec.id,
        runId: spec.runId,
        kind: spec.kind,
        state: "ready",
        address: h.e2bId,
        proxyAddress: WORK_PROXY_ADDRESS,
        controlPlaneUrl: null,
        routing: spec.routing,
        // E2B's firewall accepts a blocked connection before it drops it, so a direct-connect
        // probe cannot tell; catch-all is proved by E2B's own report instead (ensureNetwork).
        probeTarget: null,
        wiring: null,
      };
    },

    async exec(sandboxId: string, input: ExecRequest): Promise<ExecInfo> {
      const parsed = ExecRequest.safeParse(input);
      if (!parsed.success)
        throw new BackendError("invalid_request", "the exec request is outside its contract");
      const request = parsed.data;
      const execId = request.id ?? `x_${crypto.randomUUID().replaceAll("-", "")}`;
      const h = await box.resolve(sandboxId);
      const kind = h.meta[META.kind] ?? "";
      let envs = request.env;
      if (kind === "proxy" && request.argv[0] === "bw-proxy") {
        // Where the control plane is, and listeners on loopback only: the bridge is the way in.
        envs = { ...envs, BW_CONTROL_PLANE_URL: config.PUBLIC_URL, BW_LISTEN_HOST: "127.0.0.1" };
      }
      box.hide([config.E2B_API_KEY, ...Object.values(request.env)]);
      const stdin = new TextEncoder().encode(request.stdin ?? "");
      // A work sandbox's setup commands go into the setup cgroup (seal kills what they leave);
      // its execute commands run under the run's pids limit.
      const pids = Number(h.meta[META.pids] ?? Number.NaN);
      const stageOptions =
        kind === "proxy"
          ? {}
          : request.stage === "setup"
            ? { setup: true }
            : Number.isInteger(pids)
              ? { pids }
              : {};
      const status = await box.runner(
        sandboxId,
        runnerCommand(startInlineArgs(execId, request.argv, request.timeoutMs, stdin.length, stageOptions)),
        `start ${request.argv[0]}`,
        {
          user: box.userFor(kind, request.stage),
          envs,
          ...(request.cwd === undefined ? {} : { cwd: request.cwd }),
          stdin,
        },
      );
      return toExecInfo(sandboxId, status);
    },

    async poll(sandboxId: string, execId: string, poll: ExecPoll): Promise<ExecInfo> {
      const waitMs = Math.min(Math.max(poll.waitMs ?? 0, 0), MAX_POLL_WAIT_MS);
      const command = runnerCommand(pollArgs(execId, poll.stdoutFrom ?? 0, poll.stderrFrom ?? 0, waitMs));
      const status = await box.asOwner(sandboxId, (user) =>
        box.runner(sandboxId, command, "poll the command", { user, waitMs }),
      );
      return toExecInfo(sandboxId, status);
    },

    async kill(sandboxId: string, execId: string): Promise<ExecInfo> {
      const command = runnerCommand(killArgs(execId));
      const status = await box.asOwner(sandboxId, (user) =>
        box.runner(sandboxId, command, "kill the command", { user }),
      );
      return toExecInfo(sandboxId, status);
    },

    async destroy(sandboxId: string): Promise<void> {
      held.delete(box.cacheKey(sandboxId));
      const found = await box.call("find the sandbox", () => box.findAll(sandboxId));
      for (const s of found) {
        await box.call("kill the sandbox", () => Sandbox.kill(s.sandboxId, box.opts)); // false: already gone
      }
    },

    async freeze(sandboxId: string, frozen: boolean): Promise<void> {
      const h = await box.resolve(sandboxId);
      if (frozen) {
        // A pause keeps memory: processes continue where they were on resume.
        await box.call("pause the sandbox", () => Sandbox.pause(h.e2bId, box.opts)); // false: already paused
        h.sandbox = null;
        return;
      }
      const proxyId = h.meta[META.proxy];
      const routing = h.meta[META.routing] as RoutingMode | undefined;
      // A work sandbox's network is its proxy: that one runs first (it may have timed out into pause).
      const proxy = proxyId
        ? await box.proxyOf({ runId: h.meta[META.run] ?? "", proxySandboxId: proxyId })
        : null;
      h.sandbox = null;
      await box.attach(sandboxId); // connect: resumes
      if (proxy && routing) {
        try {
          await box.ensureNetwork(sandboxId, h.e2bId, workNetwork(routing, proxy.host));
        } catch (e) {
          // Never leave it running outside its boundary.
          await Sandbox.pause(h.e2bId, box.opts).catch(() => {});
          h.sandbox = null;
          throw e;
        }
      }
    },

    async list() {
      const pages = Sandbox.list({
        ...box.opts,
        query: { metadata: { [META.deployment]: box.deployment } },
        limit: 100,
      });
      const all: E2bSandboxInfo[] = [];
      while (pages.hasNext) all.push(...(await box.call("list the sandboxes", () => pages.nextItems())));
      const seen = new Map<string, { id: string; runId: string; kind: SandboxKind }>();
      for (const s of all) {
        const id = s.metadata[META.sandbox];
        const runId = s.metadata[META.run];
        const kind = SandboxKind.safeParse(s.metadata[META.kind]);
        if (!id || !runId || !kind.success) continue;
        if (!seen.has(id)) seen.set(id, { id, runId, kind: kind.data });
      }
      return [...seen.values()];
    },

    async putBundle(sandboxId: string, bundle: ReadableStream<Uint8Array>, dir: string) {
      await box.workSandbox(sandboxId, "a bundle");
      // Written by envd's files API as the execute user, into its home; unpacked by bw-unpack as
      // that user (it re-checks every entry); removed either way.
      const file = `${TRANSFER_DIR}/bundle-${crypto.randomUUID()}.tar.gz`;
      await box.call("write the bundle into the sandbox", () =>
        box.withSandbox(sandboxId, (s) =>
          s.files.write(file, bundle, { user: EXECUTE_USER, requestTimeoutMs: TRANSFER_DEADLINE_MS }),
        ),
      );
      const bounds = { maxBytes: BUNDLE_DEFAULTS.maxUnpackedBytes, maxFiles: BUNDLE_DEFAULTS.maxFiles };
      const done = await box.runToEnd(sandboxId, unpackArgv(dir, file, bounds), "unpack the bundle", {
        user: EXECUTE_USER,
        deadlineMs: TRANSFER_DEADLINE_MS,
      });
      const result = UnpackResult.safeParse(lastJson(done.stdout));
      const expected =
        done.exitCode === UNPACK_EXIT.ok ? true : done.exitCode === UNPACK_EXIT.refused ? false : null;
      if (!result.success || expected === null || result.data.ok !== expected) {
        const why = box.lastLine(done.stderr) || `exit ${done.exitCode ?? done.signal}`;
        throw new BackendError("sandbox_failed", `sandbox ${sandboxId}: bw-unpack: ${box.scrub(why)}`);
      }
      return result.data;
    },

    async seal(sandboxId: string, input: Seal): Promise<SealResult> {
      const parsed = Seal.safeParse(input);
      if (!parsed.success) throw new BackendError("invalid_request", "the seal is outside its contract");
      const seal = parsed.data;
      const h = await box.workSandbox(sandboxId, "seal");
      if (seal.caCertPem === null) {
        throw new BackendError(
          "invalid_request",
          "an E2B work sandbox always has its run's proxy: seal needs its CA",
        );
      }
      if (seal.routing !== h.meta[META.routing]) {
        throw new BackendError(
          "invalid_request",
          `sandbox ${sandboxId} was made for ${h.meta[META.routing]} routing`,
        );
      }
      // 1. What the setup stage left running dies: the setup cgroup, the setup execs' sessions,
      // and every process started since the first setup command (the sweep). Setup starts are
      // refused from now on.
      const sealed = await box.runner(
        sandboxId,
        runnerCommand(sealArgs({ sweep: true })),
        "end the setup stage",
        { user: "root" },
        RunnerSeal,
      );
      // 2. Root may have given the execute user a way back: take it away again, and check.
      await box.takeRootAway(sandboxId);
      // 3. The routing and the wiring's files again, from the control plane's copy.
      if (seal.routing === "catch-all") await box.installRedirect(sandboxId);
      await box.reinstall(sandboxId, seal, "write the wiring again");
      return { killed: sealed.killed };
    },

    async setHosts(sandboxId: string, hostsFile: string[]): Promise<void> {
      const h = await box.workSandbox(sandboxId, "setHosts");
      // Under catch-all the redirect takes every host: the hosts block names only the platform's.
      if (h.meta[META.routing] !== "default") return;
      await box.reinstall(
        sandboxId,
        { routing: "default", hostsFile, caCertPem: null },
        "rewrite the hosts file",
      );
    },

    async collect(sandboxId: string, options: { dir: string; maxBytes: number; maxFiles: number }) {
      await box.workSandbox(sandboxId, "collect");
      const name = `collect-${crypto.randomUUID()}.tar.gz`;
      const bounds = {
        maxBytes: Math.min(options.maxBytes, ARTIFACT_DEFAULTS.maxBytes),
        maxFiles: Math.min(options.maxFiles, ARTIFACT_DEFAULTS.maxFiles),
      };
      const done = await box.runToEnd(
        sandboxId,
        collectArgv(options.dir, name, bounds),
        "collect the artifacts",
        {
          user: EXECUTE_USER,
          deadlineMs: TRANSFER_DEADLINE_MS,
        },
      );
      if (done.exitCode !== 0) {
        const why = box.lastLine(done.stderr) || `exit ${done.exitCode ?? done.signal}`;
        throw new BackendError("sandbox_failed", `sandbox ${sandboxId}: bw-collect: ${box.scrub(why)}`);
      }
      // Read back as the execute user: the archive is that user's, and nothing more is readable.
      return box.call("read the artifacts", () =>
        box.withSandbox(sandboxId, (s) =>
          s.files.read(`${TRANSFER_DIR}/${name}`, {
            format: "stream",
            user: EXECUTE_USER,
            requestTimeoutMs: TRANSFER_DEADLINE_MS,
          }),
        ),
      );
    },
    // Setup images (issue 34; setup-images.ts): registry images, each with its E2B template.
    baseImage: images.baseImage,
    captureLayer: images.captureLayer,
    dropLayer: images.dropLayer,
    // Found through their rows only, as on sandbox0: a template's name does not give its digest back.
    listLayers: async () => [],
  };
}
