import { type RunSpec, readStoredSpec } from "@benchwright/shared/contract/run-spec";
import type { Child } from "hono/jsx";
import { commandsOf } from "../runs/benchmarks";
import type { RunRow, TraceRow } from "../runs/service";

// The run page's "Stages" card: each sandbox's two stages as its trace recorded them, the setup
// stage (bundle, setup commands as root, seal, the wiring proved again) and then the execute
// stage (the commands, the results collected). A failed setup command and a sandbox killed at a
// resource limit are named here, with the command and what ended it. A sandbox that started from
// a setup image, or built one, says which (its digest, and which run built it).

/** What the coordinator records per stage (src/coordinator/steps/stages.ts, output.ts). */
interface StageEvent {
  sandbox?: unknown;
  name?: unknown;
  stage?: unknown;
  command?: unknown;
  exitCode?: unknown;
  signal?: unknown;
  limit?: unknown;
  killed?: unknown;
  files?: unknown;
  bytes?: unknown;
  cut?: unknown;
  ok?: unknown;
  error?: unknown;
  installed?: unknown;
  proof?: unknown;
  digest?: unknown;
  builtByRunId?: unknown;
  builtNow?: unknown;
}

interface Exit {
  exitCode: number | null;
  signal: string | null;
  limit: string | null;
}

/** The setup image a sandbox started from (use) or kept (build), from its `setup_image` row. */
interface StageImage {
  digest: string;
  /** This sandbox ran the setup and kept it (its bytes), rather than starting from it. */
  built: { bytes: number } | null;
  /** The run that built it (null: deleted since), and whether that is this run. */
  builtByRunId: string | null;
  builtNow: boolean;
}

interface SandboxStages {
  name: string;
  image: StageImage | null;
  bundle: { files: number; bytes: number } | null;
  setup: Map<number, Exit>;
  sealed: number | null;
  reproved: boolean | null;
  commands: Map<number, Exit>;
  collected: { ok: boolean; files: number; bytes: number; cut: number; error: string | null } | null;
  /** When its last setup-stage row (bundle, setup output or exit, seal) was recorded. */
  setupLast: Date | null;
  /** When its first execute-stage row (re-proof, command output or exit, collect) was recorded. */
  executeFirst: Date | null;
}

/** Which of a sandbox's two stages a trace row belongs to, if either (the timeline splits on it). */
function stageOfRow(kind: string, d: StageEvent): "setup" | "execute" | null {
  if (kind === "output") return d.stage === "setup" ? "setup" : "execute";
  if (kind === "proxy") return d.installed === true ? "execute" : null;
  if (kind === "note") {
    if (d.stage === "bundle" || d.stage === "seal" || d.stage === "setup_image") return "setup";
    if (d.stage === "collect") return "execute";
  }
  return null;
}

const num = (v: unknown) => (typeof v === "number" ? v : 0);
const str = (v: unknown) => (typeof v === "string" ? v : null);

/** The stages of each sandbox, in the order its first event came. */
export function stagesOf(trace: TraceRow[]): Map<string, SandboxStages> {
  const out = new Map<string, SandboxStages>();
  for (const e of trace) {
    const d = e.detail as StageEvent | null;
    const sandbox = str(d?.sandbox);
    if (!d || sandbox === null) continue;
    const s = out.get(sandbox) ?? {
      name: str(d.name) ?? sandbox,
      image: null,
      bundle: null,
      setup: new Map(),
      sealed: null,
      reproved: null,
      commands: new Map(),
      collected: null,
      setupLast: null,
      executeFirst: null,
    };
    out.set(sandbox, s);
    const stage = stageOfRow(e.kind, d);
    if (stage === "setup") s.setupLast = e.at;
    else if (stage === "execute") s.executeFirst ??= e.at;
    if (e.kind === "output" && "exitCode" in d) {
      const exit = {
        exitCode: typeof d.exitCode === "number" ? d.exitCode : null,
        signal: str(d.signal),
        limit: str(d.limit),
      };
      (d.stage === "setup" ? s.setup : s.commands).set(num(d.command), exit);
    } else if (e.kind === "proxy" && d.installed === true) {
      s.reproved = (d.proof as { ok?: unknown } | null)?.ok === true;
    } else if (e.kind === "note" && d.stage === "bundle") {
      s.bundle = { files: num(d.files), bytes: num(d.bytes) };
    } else if (e.kind === "note" && d.stage === "seal") {
      s.sealed = num(d.killed);
    } else if (e.kind === "note" && d.stage === "setup_image" && str(d.digest) !== null) {
      s.image = {
        digest: str(d.digest) as string,
        built: typeof d.bytes === "number" ? { bytes: d.bytes } : null,
        builtByRunId: str(d.builtByRunId),
        builtNow: d.builtNow === true,
      };
    } else if (e.kind === "note" && d.stage === "collect") {
      s.collected = {
        ok: d.ok !== false,
        files: num(d.files),
        bytes: num(d.bytes),
        cut: num(d.cut),
        error: str(d.error),
      };
    }
  }
  return out;
}

/** A sandbox's setup commands and commands, by its name (the work sandbox, the orchestrator, a task). */
export function commandsFor(spec: RunSpec, name: string): { setup: string[]; commands: readonly string[] } {
  const task = spec.tasks?.find((t) => t.name === name);
  if (task) return { setup: [...(spec.setup ?? []), ...(task.setup ?? [])], commands: task.commands };
  if (name === "work" || name === "orchestrator")
    return { setup: spec.setup ?? [], commands: commandsOf(spec) };
  return { setup: [], commands: [] };
}

const shown = (cmd: string | undefined) =>
  cmd === undefined ? "" : cmd.length > 160 ? `${cmd.slice(0, 160)}…` : cmd;

function ended(exit: Exit | undefined): { text: string; bad: boolean } {
  if (!exit) return { text: "not run", bad: false };
  if (exit.limit) return { text: `killed at its ${exit.limit} limit`, bad: true };
  if (exit.exitCode === null) return { text: `killed${exit.signal ? ` (${exit.signal})` : ""}`, bad: true };
  return { text: `exited ${exit.exitCode}`, bad: exit.exitCode !== 0 };
}

function CommandRows(props: {
  stage: string;
  label: string;
  list: readonly string[];
  exits: Map<number, Exit>;
}) {
  const count = Math.max(props.list.length, ...[...props.exits.keys()].map((i) => i + 1));
  const rows: Child[] = [];
  for (let i = 0; i < count; i++) {
    const { text, bad } = ended(props.exits.get(i));
    rows.push(
      <tr class={bad ? "error" : undefined}>
        <td>{props.stage}</td>
        <td class="mono">
          {props.label} {i + 1}: {shown(props.list[i])}
        </td>
        <td>{text}</td>
      </tr>,
    );
  }
  return <>{rows}</>;
}

function SandboxTable(props: { s: SandboxStages; setup: string[]; commands: readonly string[] }) {
  const { s } = props;
  // Started from a setup image: its setup commands ran where the image was built, not here.
  const fromImage = s.image !== null && s.image.built === null;
  return (
    <details open={[...s.setup.values(), ...s.commands.values()].some((x) => ended(x).bad)}>
      <summary>
        Stages of <strong>{s.name}</strong>
      </summary>
      <table>
        <thead>
          <tr>
            <th style="width:6rem">Stage</th>
            <th>Step</th>
            <th style="width:16rem">Result</th>
          </tr>
        </thead>
        <tbody>
          {fromImage && s.image ? <ImageRow image={s.image} /> : null}
          {s.bundle ? (
            <tr>
              <td>setup</td>
              <td>bundle unpacked</td>
              <td>{`${s.bundle.files} file(s), ${s.bundle.bytes} bytes`}</td>
            </tr>
          ) : null}
          {fromImage ? null : <CommandRows stage="setup" label="setup" list={props.setup} exits={s.setup} />}
          {s.sealed !== null ? (
            fromImage ? (
              <tr>
                <td>setup</td>
                <td>sealed: the wiring's files installed from outside (no setup stage)</td>
                <td>sealed</td>
              </tr>
            ) : (
              <tr>
                <td>setup</td>
                <td>sealed: its leftover processes killed, the wiring re-installed</td>
                <td>{`${s.sealed} process(es) killed`}</td>
              </tr>
            )
          ) : null}
          {s.image?.built ? <ImageRow image={s.image} /> : null}
          {s.reproved !== null ? (
            <tr class={s.reproved ? undefined : "error"}>
              <td>execute</td>
              <td>{fromImage ? "the wiring proved, before any command" : "the wiring proved again"}</td>
              <td>{s.reproved ? "proved" : "not proved"}</td>
            </tr>
          ) : null}
          <CommandRows stage="execute" label="command" list={props.commands} exits={s.commands} />
          {s.collected ? (
            <tr class={s.collected.ok ? undefined : "warning"}>
              <td>execute</td>
              <td>$BW_OUT collected</td>
              <td>
                {s.collected.ok
                  ? `${s.collected.files} file(s), ${s.collected.bytes} bytes${s.collected.cut > 0 ? `, ${s.collected.cut} cut` : ""}`
                  : `not collected (${s.collected.error ?? "failed"})`}
              </td>
            </tr>
          ) : null}
        </tbody>
      </table>
    </details>
  );
}

const MIB = 1024 * 1024;

/**
 * "started from setup image sha256:…, built by run X" (or "built now"): in place of the setup
 * commands, which ran when it was built; a builder's "setup kept as" row comes after its seal.
 */
function ImageRow(props: { image: StageImage }) {
  const { image } = props;
  const by = image.builtNow ? (
    "built now"
  ) : image.builtByRunId ? (
    <>
      built by run <a href={`/runs/${image.builtByRunId}`}>{image.builtByRunId}</a>
    </>
  ) : (
    "built by a run since deleted"
  );
  return (
    <tr>
      <td>setup</td>
      <td>
        {image.built ? "setup kept as " : "started from "}setup image <span class="mono">{image.digest}</span>
      </td>
      <td>
        {by}
        {image.built ? ` (${(image.built.bytes / MIB).toFixed(1)} MiB)` : null}
      </td>
    </tr>
  );
}

/** Why a run stopped in a stage, in words, with what the trace knows of it. */
function StageStop(props: { run: RunRow; stages: Map<string, SandboxStages> }) {
  const { run, stages } = props;
  if (run.reason === "setup_failed") {
    return (
      <p class="error">
        A setup command failed, so the run stopped before any command ran after it: {run.reasonDetail ?? ""}
      </p>
    );
  }
  if (run.reason === "resource_exhausted") {
    const hit = [...stages.values()].flatMap((s) =>
      [...s.setup.values(), ...s.commands.values()]
        .filter((x) => x.limit)
        .map((x) => `${s.name}: ${x.limit}`),
    );
    return (
      <p class="error">
        A sandbox was killed at a resource limit{hit.length > 0 ? ` (${hit.join(", ")})` : ""}, so the run
        stopped: {run.reasonDetail ?? ""}
      </p>
    );
  }
  return null;
}

export function Stages(props: { run: RunRow; trace: TraceRow[] }) {
  const stages = stagesOf(props.trace);
  const spec = readStoredSpec(props.run.spec);
  const shownSandboxes = [...stages].filter(
    ([, s]) => s.setup.size + s.commands.size > 0 || s.bundle !== null || s.collected !== null,
  );
  return (
    <section id="stages">
      <h2>Stages</h2>
      <p class="muted">
        Each sandbox's setup stage (its bundle, the setup commands as the sandbox's root, then the seal that
        ends them and the wiring proved again) and its execute stage (the commands, unprivileged; then $BW_OUT
        collected). A sandbox started from a setup image skips the bundle and the setup commands: it is sealed
        from outside and its wiring proved before any command.
      </p>
      <StageStop run={props.run} stages={stages} />
      {shownSandboxes.length === 0 ? (
        <p class="empty">Nothing ran in a sandbox yet.</p>
      ) : (
        shownSandboxes.map(([, s]) => {
          const { setup, commands } = commandsFor(spec, s.name);
          return <SandboxTable s={s} setup={setup} commands={commands} />;
        })
      )}
    </section>
  );
}
