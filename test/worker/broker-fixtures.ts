import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import type { Seal } from "@benchwright/shared/contract/local-agent";
import type { CapturedImage } from "@benchwright/shared/contract/setup-image";
import type { ComputeBackend, SandboxSpec } from "../../src/broker/backend";
import { SandboxBroker } from "../../src/broker/sandbox-broker";
import { randomId } from "../../src/crypto/api-keys";
import { sandboxes } from "../../src/db/schema";
import { withDb } from "./harness";

// The broker's own logic (ownership, what it reads and hands a backend, the setup_images rows)
// tested in its Durable Object over real Postgres, with a backend that records what it is asked.
// The local backend's HTTP side is exercised against the real host agent by the end-to-end suite.

/** A local backend's settings on a loopback port nothing listens on: a stray call fails. */
export const BACKEND = {
  COMPUTE_BACKEND: "local",
  COMPUTE_BACKEND_URL: "http://127.0.0.1:9",
  COMPUTE_BACKEND_SECRET: "s".repeat(32),
};

/** What the recording backend answers for setup images (tests change these as they go). */
export interface SetupImageAnswers {
  /** baseImage(): the work image's digest, or null (keeps no setup images). */
  base: string | null;
  /** captureLayer(): what it captured, or what it throws. */
  capture: (sandboxId: string, maxBytes: number) => Promise<CapturedImage>;
  /** create(): thrown instead of making the sandbox (a layer the backend refuses). */
  createError: Error | null;
  /** listLayers(): the layers the backend keeps. */
  layers: Array<{ digest: string; createdAt: string; inUse: number }>;
  /** dropLayer(): digests a live sandbox starts from (answered in_use). */
  inUse: string[];
}

/** A backend that records every call the broker makes, with the arguments. */
export function recordingBackend(answers: Partial<SetupImageAnswers> = {}) {
  const calls: Array<{ method: string; sandboxId: string; args: unknown[] }> = [];
  const setupImages: SetupImageAnswers = {
    base: null,
    capture: async () => {
      throw new Error("no capture answer set");
    },
    createError: null,
    layers: [],
    inUse: [],
    ...answers,
  };
  const record =
    (method: string) =>
    async (sandboxId: string, ...args: unknown[]) => {
      calls.push({ method, sandboxId, args });
      return undefined as never;
    };
  const backend = {
    name: "local" as const,
    calls,
    setupImages,
    create: async (spec: SandboxSpec) => {
      calls.push({ method: "create", sandboxId: spec.id, args: [spec] });
      if (setupImages.createError) throw setupImages.createError;
      return {
        id: spec.id,
        runId: spec.runId,
        kind: spec.kind,
        state: "ready" as const,
        address: "10.0.0.2",
        proxyAddress: null,
        controlPlaneUrl: null,
        routing: null,
        probeTarget: null,
        wiring: null,
      };
    },
    exec: record("exec"),
    poll: record("poll"),
    kill: record("kill"),
    destroy: record("destroy"),
    freeze: record("freeze"),
    list: async () => [],
    putBundle: async (sandboxId: string, bundle: ReadableStream<Uint8Array>, dir: string) => {
      const bytes = new Uint8Array(await new Response(bundle).arrayBuffer());
      calls.push({ method: "putBundle", sandboxId, args: [bytes, dir] });
      return { ok: true as const, files: 1, bytes: bytes.length };
    },
    seal: async (sandboxId: string, seal: Seal) => {
      calls.push({ method: "seal", sandboxId, args: [seal] });
      return { killed: 2 };
    },
    setHosts: record("setHosts"),
    collect: record("collect"),
    baseImage: async () => setupImages.base,
    captureLayer: async (sandboxId: string, maxBytes: number) => {
      calls.push({ method: "captureLayer", sandboxId, args: [maxBytes] });
      return setupImages.capture(sandboxId, maxBytes);
    },
    dropLayer: async (digest: string) => {
      calls.push({ method: "dropLayer", sandboxId: "", args: [digest] });
      return setupImages.inUse.includes(digest) ? ("in_use" as const) : ("dropped" as const);
    },
    listLayers: async () => setupImages.layers,
  } satisfies ComputeBackend & { calls: unknown[]; setupImages: SetupImageAnswers };
  return backend;
}

/** Runs fn on a broker whose every backend is `backend` (and whose env has `over` on top). */
export function withBackend<T>(
  backend: ComputeBackend,
  fn: (broker: SandboxBroker) => Promise<T>,
  over: Record<string, string> = {},
): Promise<T> {
  // An instance of its own: these tests call about several runs through one broker object.
  const stub = env.SANDBOX_BROKER.get(env.SANDBOX_BROKER.newUniqueId());
  return runInDurableObject(stub, (_instance, state) => {
    const broker = new SandboxBroker(state, { ...env, ...BACKEND, ...over });
    Object.defineProperty(broker, "backendOf", { value: () => backend });
    return fn(broker);
  });
}

/** A sandbox of the run, recorded as the broker would have made it. */
export async function sandboxRow(
  runId: string,
  kind: "proxy" | "work" | "task",
  status: "ready" | "destroyed" = "ready",
) {
  const id = randomId("sbx_");
  await withDb((db) => db.insert(sandboxes).values({ id, runId, kind, backend: "local", status }));
  return id;
}
