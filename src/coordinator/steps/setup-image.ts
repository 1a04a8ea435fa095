import type { BrokerCode } from "@benchwright/shared/contract/broker";
import { resourcesFor } from "@benchwright/shared/contract/run-spec";
import type { SetupImageKey, SetupImageMode } from "@benchwright/shared/contract/setup-image";
import type { BrokerFailed, SandboxRequest, SetupImageRequest } from "../../broker/interface";
import { BrokerFailure, type Machine } from "../ports";
import type { MachineState, Worker, WorkerImage } from "../state";
import { checkpoint } from "./common";

// Setup images (issue 34): a work, task or orchestrator sandbox with setup commands asks the
// broker, before it is made, what to do about them (claimSetupImage; the broker computes the key
// and arbitrates between sandboxes and runs):
//
//   use   → made from the environment's built image (the broker names the digest, never this
//           side: case P3): no bundle, no setup stage and no wiring program as its root; it is
//           sealed from outside and proved from the execute stage before any command (case P5).
//   build → made with `capture`; bundle → setup → seal as always, then the capture (stages.ts)
//           before the re-proof. A capture refused (too large, full, unsupported…) is a warning:
//           the run goes on uncached and this run's other sandboxes of that setup run their own.
//           Until its capture the builder claims again every LEASE_RENEW_MS (renewBuilds), which
//           renews its lease.
//   wait  → not made yet, and it takes no maxParallelTasks slot: it asks again when this run's
//           builder of the key is through, or every WAIT_POLL_MS; a wait for another run's build
//           ends after Machine.setupImageWaitMs, and the sandbox runs its own setup.
//   none  → its own setup, as before setup images; the reason is in the trace once per run.
//
// A failed setup is never kept: every stop goes through teardown, which releases the run's
// builds still in progress (releaseBuilds).

/** How long a sandbox waits for another run's build (default; SETUP_IMAGE_WAIT_SECONDS sets it). */
export const SETUP_IMAGE_WAIT_MS = 600_000;
/** How often a builder renews its lease (the broker's is 120 s) while its setup runs. */
export const LEASE_RENEW_MS = 30_000;
/** How often a waiting sandbox asks whether the build it waits for is done. */
export const WAIT_POLL_MS = 5_000;

/** A create that names a built image the backend or broker could not start: it is built again (case P6). */
const MISSING_CODES: ReadonlySet<BrokerCode> = new Set([
  "setup_image_missing",
  "setup_image_mismatch",
  "setup_image_not_found",
]);

const MIB = 1024 * 1024;

/**
 * Before a worker's sandbox is made: what to do about its setup, kept on it (`w.image`). "go": make
 * it now (the image says how, createFields); "wait": not yet.
 */
export async function claimImage(m: Machine, s: MachineState, w: Worker): Promise<"go" | "wait"> {
  if (w.setup.length === 0) return "go";
  const image = w.image;
  if (image !== null && image.role !== "wait") return "go"; // decided: a replay makes the same sandbox
  if (image?.role === "wait") {
    const builder = builderOf(s, w, image.key);
    if (builder?.state === "failed") {
      return fallBack(m, s, w, "this run's build of the same setup was not kept (see the run's notes)");
    }
    if (builder?.state === "building") return "wait"; // through this run's own steps: nothing to ask
    const now = m.ports.now();
    if (builder?.state !== "captured") {
      if (now - image.claimedAt < WAIT_POLL_MS) return "wait";
      if (image.builderRunId !== s.runId && now - image.since >= m.setupImageWaitMs) {
        await m.ports.note(s.runId, {
          level: "note",
          code: "setup_image_wait_expired",
          text: `${w.name} waited ${Math.round((now - image.since) / 1000)} s for ${image.builderRunId ? `run ${image.builderRunId}'s` : "another run's"} build of its setup image (SETUP_IMAGE_WAIT_SECONDS), so it runs its own setup and keeps nothing.`,
        });
        return fallBack(m, s, w, "waited too long for another run's build");
      }
    }
  }
  return ask(m, s, w);
}

/** The create request's setup-image fields for a worker whose claim is decided. */
export function createFields(
  w: Worker,
): Pick<Exclude<SandboxRequest, { kind: "proxy" }>, "setup" | "capture" | "setupImage"> {
  if (w.setup.length === 0) return {};
  if (w.image?.role === "use") return { setupImage: { key: w.image.key } };
  return { setup: true, ...(w.image?.role === "build" ? { capture: true } : {}) };
}

/** The create of a `use` sandbox was refused because its image is not there (case P6). */
export function imageMissing(w: Worker, failed: BrokerFailed): boolean {
  return w.image?.role === "use" && MISSING_CODES.has(failed.code);
}

/**
 * The broker dropped the image the create named (its layer missing, not matching its digest, or
 * its row gone): says so, and claims again under a fresh sandbox id (the refused one may be
 * recorded as failed), which builds it. Never starts around the bad image: an answer that names
 * an image again is taken as none.
 */
export async function rebuildMissing(
  m: Machine,
  s: MachineState,
  w: Worker,
  failed: BrokerFailed,
): Promise<"go" | "wait"> {
  const image = w.image as Extract<WorkerImage, { role: "use" }>;
  const text = `The setup image ${image.digest} for ${w.name} was missing (${failed.code}: ${failed.message}); it was dropped and its setup runs again to rebuild it.`;
  await m.ports.note(s.runId, { level: "warning", code: "setup_image_rebuilt", text });
  await traceSandbox(m, s, w, `setup-image-rebuilt:${w.sandboxId}`, image.key, text);
  w.sandboxId = m.ports.newId("sbx_");
  w.image = null;
  await checkpoint(m, s);
  const again = await ask(m, s, w);
  const answered = w.image as WorkerImage | null; // set by ask
  if (answered?.role === "use") {
    return fallBack(m, s, w, `the broker named the missing image again (${failed.code})`);
  }
  return again;
}

/** The trace row of a sandbox made from a setup image (after its create). */
export async function traceUse(m: Machine, s: MachineState, w: Worker): Promise<void> {
  const image = w.image;
  if (image?.role !== "use") return;
  const builtNow = image.builtByRunId === s.runId;
  const by = builtNow
    ? "built now"
    : image.builtByRunId
      ? `built by run ${image.builtByRunId}`
      : "built by a run since deleted";
  await m.ports.event(s.runId, `setup-image:${w.sandboxId}`, "note", {
    sandbox: w.sandboxId,
    name: w.name,
    stage: "setup_image",
    key: image.key,
    digest: image.digest,
    builtByRunId: image.builtByRunId,
    builtNow,
    text: `${w.name} starts from setup image ${image.digest}, ${by}: no setup stage.`,
  });
}

/**
 * The run's builders' leases, renewed while each is before its capture (called at each step of
 * `wiring` and `running`, at most every LEASE_RENEW_MS per builder). A halted run renews nothing:
 * its builds lapse rather than hold other runs up.
 */
export async function renewBuilds(m: Machine, s: MachineState): Promise<void> {
  for (const w of s.workers) await renewBuild(m, s, w);
}

/**
 * A renewal answered otherwise means the lease lapsed and another sandbox took the build over:
 * this one runs its setup to the end as before and keeps nothing.
 */
async function renewBuild(m: Machine, s: MachineState, w: Worker): Promise<void> {
  const image = w.image;
  if (image?.role !== "build" || image.state !== "building" || w.stage === "capture") return;
  const now = m.ports.now();
  if (now - image.claimedAt < LEASE_RENEW_MS) return;
  const answer = await m.ports.broker.claimSetupImage(s.runId, w.sandboxId, requestOf(s, w));
  if (!answer.ok) {
    // Tried again at the next step; the lease (120 s) outlasts a few missed renewals.
    m.ports.log({
      event: "setup_image_renew_failed",
      runId: s.runId,
      sandboxId: w.sandboxId,
      code: answer.code,
    });
    return;
  }
  if (answer.value.role === "build" && answer.value.key === image.key) {
    image.claimedAt = now;
    return;
  }
  w.image = { role: "none", reason: "another sandbox took its build over" };
  await m.ports.event(s.runId, `setup-image:${w.sandboxId}`, "note", {
    sandbox: w.sandboxId,
    name: w.name,
    stage: "setup_image",
    key: image.key,
    text: `${w.name} lost its build of setup image ${image.key} to another sandbox (its lease lapsed): its setup runs on and nothing of it is kept.`,
  });
  await checkpoint(m, s);
}

/**
 * The builder's capture, between its seal and its re-proof. Never stops the run: a refusal is a
 * warning, the build is released, and the run goes on uncached. A thrown error (the broker not
 * reached) is a fault: the step is retried, the capture with it.
 */
export async function captureImage(m: Machine, s: MachineState, w: Worker): Promise<void> {
  const image = w.image;
  if (image?.role !== "build" || image.state !== "building") return;
  const kept = await m.ports.broker.captureSetupImage(s.runId, w.sandboxId, image.key);
  if (kept.ok) {
    const { digest, bytes, files } = kept.value;
    image.state = "captured";
    image.digest = digest;
    await m.ports.event(s.runId, `setup-image:${w.sandboxId}`, "note", {
      sandbox: w.sandboxId,
      name: w.name,
      stage: "setup_image",
      key: image.key,
      digest,
      bytes,
      files,
      builtByRunId: s.runId,
      builtNow: true,
      text: `Setup image ${digest} built now (${(bytes / MIB).toFixed(1)} MiB, ${files} files) from the setup of ${w.name}.`,
    });
  } else {
    image.state = "failed";
    m.ports.log({ event: "setup_image_not_kept", runId: s.runId, sandboxId: w.sandboxId, code: kept.code });
    const text = `The setup of ${w.name} was not kept as a setup image (${kept.code}: ${kept.message}); the run goes on, and its other sandboxes of the same setup run it themselves.`;
    await m.ports.note(s.runId, { level: "warning", code: "setup_image_not_kept", text });
    await traceSandbox(m, s, w, `setup-image-not-kept:${w.sandboxId}`, image.key, text);
    await release(m, s, w.sandboxId, image.key);
  }
  await checkpoint(m, s);
}

/** At the run's end: its builds still in progress are given up (a failed setup is never kept). */
export async function releaseBuilds(m: Machine, s: MachineState): Promise<void> {
  for (const w of s.workers) {
    if (w.image?.role !== "build" || w.image.state !== "building") continue;
    await release(m, s, w.sandboxId, w.image.key);
    w.image.state = "failed";
  }
}

/**
 * A builder that ends before its capture while the run goes on (an environment deleted during its
 * setup): its build is released, and this run's sandboxes waiting for it claim again, so one of
 * them builds the key instead.
 */
export async function giveUpBuild(m: Machine, s: MachineState, w: Worker): Promise<void> {
  const image = w.image;
  if (image?.role !== "build" || image.state !== "building") return;
  await release(m, s, w.sandboxId, image.key);
  w.image = { role: "none", reason: "ended before its capture" };
}

async function release(m: Machine, s: MachineState, sandboxId: string, key: SetupImageKey): Promise<void> {
  try {
    await m.ports.broker.releaseSetupImage(s.runId, sandboxId, key);
  } catch (error) {
    // Never holds the run up: the build's lease lapses on its own, and the next claim takes it.
    const code = error instanceof BrokerFailure ? error.code : "release_failed";
    m.ports.log({ event: "setup_image_release_failed", runId: s.runId, sandboxId, code });
  }
}

/** Asks the broker and keeps its answer on the worker. */
async function ask(m: Machine, s: MachineState, w: Worker): Promise<"go" | "wait"> {
  const answer = await m.ports.broker.claimSetupImage(s.runId, w.sandboxId, requestOf(s, w));
  if (!answer.ok) {
    if (answer.retryable) throw new BrokerFailure(answer);
    // Its code only: a message from below the broker may name its internals.
    m.ports.log({
      event: "setup_image_claim_failed",
      runId: s.runId,
      sandboxId: w.sandboxId,
      code: answer.code,
    });
    await traceNone(m, s, `the broker could not say (${answer.code})`);
    return decide(m, s, w, { role: "none", reason: answer.code });
  }
  const claim = answer.value;
  const now = m.ports.now();
  const since = w.image?.role === "wait" ? w.image.since : now;
  const wait = (key: SetupImageKey, builderRunId: string | null) =>
    decide(m, s, w, { role: "wait", key, builderRunId, since, claimedAt: now });
  switch (claim.role) {
    case "use":
      // A rebuild of this run is in progress: its sandboxes start from the fresh image.
      if (builderOf(s, w, claim.key)?.state === "building") return wait(claim.key, s.runId);
      return decide(m, s, w, {
        role: "use",
        key: claim.key,
        digest: claim.digest,
        builtByRunId: claim.builtByRunId,
      });
    case "build":
      if (builderOf(s, w, claim.key)?.state === "failed") {
        // Kept once already this run and refused: not tried again, the setup just runs.
        await release(m, s, w.sandboxId, claim.key);
        return fallBack(m, s, w, "this run's build of the same setup was not kept (see the run's notes)");
      }
      return decide(m, s, w, {
        role: "build",
        key: claim.key,
        claimedAt: now,
        state: "building",
        digest: null,
      });
    case "wait":
      if (builderOf(s, w, claim.key)?.state === "failed") {
        return fallBack(m, s, w, "this run's build of the same setup was not kept (see the run's notes)");
      }
      return wait(claim.key, claim.builderRunId);
    case "none":
      await traceNone(m, s, claim.reason);
      return decide(m, s, w, { role: "none", reason: claim.reason });
  }
}

async function decide(m: Machine, s: MachineState, w: Worker, image: WorkerImage): Promise<"go" | "wait"> {
  w.image = image;
  await checkpoint(m, s); // the create that follows is made as this says, also after a replay
  return image.role === "wait" ? "wait" : "go";
}

/** The sandbox runs its own setup and keeps nothing. */
function fallBack(m: Machine, s: MachineState, w: Worker, reason: string): Promise<"go"> {
  return decide(m, s, w, { role: "none", reason }) as Promise<"go">;
}

/**
 * A sandbox's own setup-image row (no digest: the run page's stages show only images started
 * from or kept). The run's notes keep one per code, so a second sandbox's reason would be lost
 * there; the trace keeps each.
 */
async function traceSandbox(
  m: Machine,
  s: MachineState,
  w: Worker,
  key: string,
  imageKey: SetupImageKey,
  text: string,
): Promise<void> {
  await m.ports.event(s.runId, key, "note", {
    sandbox: w.sandboxId,
    name: w.name,
    stage: "setup_image",
    key: imageKey,
    text,
  });
}

/** Why setup runs uncached, in the trace once per run (not per sandbox). */
async function traceNone(m: Machine, s: MachineState, reason: string): Promise<void> {
  await m.ports.event(s.runId, "setup-image:none", "note", {
    stage: "setup_image",
    text: `Setup runs in each sandbox and nothing of it is kept as a setup image: ${reason}.`,
  });
}

/** This run's builder of the key (another worker), if it has one. */
function builderOf(s: MachineState, w: Worker, key: SetupImageKey) {
  for (const x of s.workers) {
    if (x !== w && x.image?.role === "build" && x.image.key === key) return x.image;
  }
  return null;
}

/** What the broker hashes into the key (with the backend and base it knows), and the mode. */
function requestOf(s: MachineState, w: Worker): SetupImageRequest {
  return {
    setup: w.setup,
    bundle: s.spec?.bundle ?? null,
    resources: resourcesFor(s.spec?.resources, w.kind),
    mode: modeOf(s, w),
  };
}

/**
 * `rebuild` once per distinct setup and run: once one sandbox of the run has its answer, the
 * others of the same setup claim `use`, so that they start from this run's fresh build (a second
 * `rebuild` claim would build it again).
 */
function modeOf(s: MachineState, w: Worker): SetupImageMode {
  if (s.spec?.setupImage !== "rebuild") return "use";
  const mine = inputsOf(s, w);
  const decided = s.workers.some(
    (x) => x !== w && (x.image?.role === "build" || x.image?.role === "use") && inputsOf(s, x) === mine,
  );
  return decided ? "use" : "rebuild";
}

/** The key's inputs this side knows (the bundle is the run's: the same for every sandbox). */
function inputsOf(s: MachineState, w: Worker): string {
  const { memoryMb, pids } = resourcesFor(s.spec?.resources, w.kind);
  return JSON.stringify([w.setup, memoryMb, pids]);
}
