import { readStoredSpec } from "@benchwright/shared/contract/run-spec";
import type { Child } from "hono/jsx";
import { isTerminal, type RunRow, type TraceRow } from "../runs/service";
import { When } from "./layout";
import { commandsFor } from "./run-stages";

// The run page's "Trace" card: the trace's rows (transitions, notes, proxy events, bug reports),
// the first and the last of a long one, then each sandbox's command output, bounded, in
// <details>. Output is shown as text (JSX escapes it); the API's trace has everything kept.

/** Trace rows shown (transitions, notes, proxy events, bug reports): the first and the last. */
export const TRACE_HEAD_ROWS = 50;
export const TRACE_TAIL_ROWS = 250;
/** Command output shown per sandbox; the API's trace has all that was kept (256 KiB a run). */
export const OUTPUT_CHARS_SHOWN = 64 * 1024;

const text = (detail: unknown): string | null => {
  const t = (detail as { text?: unknown } | null)?.text;
  return typeof t === "string" ? t : null;
};

function describeEvent(e: TraceRow): { what: Child; detail: Child } {
  const d = e.detail as Record<string, unknown> | null;
  switch (e.kind) {
    case "transition":
      return {
        what: (
          <>
            → <strong>{e.state}</strong> <code>{e.reason}</code>
          </>
        ),
        detail: text(d),
      };
    case "note":
      if (d && typeof d.stage === "string") return { what: d.stage, detail: text(d) };
      if (d && typeof d.level === "string" && typeof d.code === "string") {
        return {
          what: (
            <>
              {d.level} <code>{d.code}</code>
            </>
          ),
          detail: text(d),
        };
      }
      return { what: "note", detail: text(d) };
    case "proxy":
      if (d && "proof" in d) {
        const ok = (d.proof as { ok?: unknown } | null)?.ok === true;
        return {
          what: d.installed === true ? "wiring proved again" : "wiring",
          detail: `${String(d.name)} (${String(d.routing)}): ${ok ? "proved" : "not proved"}`,
        };
      }
      return { what: "proxy ready", detail: `policy version ${String(d?.policyVersion ?? "?")}` };
    case "bug_report":
      return { what: "bug report", detail: String(d?.title ?? "") };
    default:
      return { what: e.kind, detail: null };
  }
}

function TraceTable(props: { runId: string; rows: TraceRow[] }) {
  const rows = props.rows;
  const skipped = Math.max(0, rows.length - TRACE_HEAD_ROWS - TRACE_TAIL_ROWS);
  const shown: (TraceRow | null)[] =
    skipped > 0 ? [...rows.slice(0, TRACE_HEAD_ROWS), null, ...rows.slice(-TRACE_TAIL_ROWS)] : rows;
  return (
    <table>
      <thead>
        <tr>
          <th style="width:12rem">At</th>
          <th style="width:16rem">What</th>
          <th>Detail</th>
        </tr>
      </thead>
      <tbody>
        {shown.map((e) => {
          if (e === null) {
            return (
              <tr>
                <td colspan={3} class="muted">
                  … {skipped} rows not shown here (GET /v1/runs/{props.runId} has the whole trace) …
                </td>
              </tr>
            );
          }
          const { what, detail } = describeEvent(e);
          return (
            <tr>
              <td>
                <When at={e.at} />
              </td>
              <td>{what}</td>
              <td>{detail}</td>
            </tr>
          );
        })}
      </tbody>
    </table>
  );
}

interface OutputChunk {
  sandbox: string;
  name: string;
  /** "setup" for a setup command's output; absent or "execute" for a command's. */
  stage?: string;
  command: number;
  stream?: string;
  text?: string;
  truncated?: boolean;
  exitCode?: number | null;
  signal?: string | null;
}

/** One sandbox's output, in the order it was recorded, cut at OUTPUT_CHARS_SHOWN characters. */
function SandboxOutput(props: {
  runId: string;
  name: string;
  chunks: OutputChunk[];
  commands: readonly string[];
  setup: readonly string[];
}) {
  let room = OUTPUT_CHARS_SHOWN;
  let hidden = 0;
  let cut = false;
  const blocks: Child[] = [];
  let current = "";
  for (const c of props.chunks) {
    const setup = c.stage === "setup";
    if (`${setup}:${c.command}` !== current) {
      current = `${setup}:${c.command}`;
      const cmd = (setup ? props.setup : props.commands)[c.command];
      blocks.push(
        <div class="mono muted">
          $ {setup ? "setup" : "command"} {c.command + 1}
          {cmd ? `: ${cmd.length > 160 ? `${cmd.slice(0, 160)}…` : cmd}` : ""}
        </div>,
      );
    }
    if (c.text !== undefined) {
      if (c.truncated) cut = true;
      const kept = c.text.slice(0, Math.max(0, room));
      hidden += c.text.length - kept.length;
      room -= kept.length;
      if (kept.length > 0)
        blocks.push(<pre class={c.stream === "stderr" ? "stderr" : undefined}>{kept}</pre>);
    } else if ("exitCode" in c) {
      blocks.push(
        <div class="muted">
          exited {c.exitCode ?? "—"}
          {c.signal ? ` (signal ${c.signal})` : ""}
        </div>,
      );
    }
  }
  return (
    <details>
      <summary>
        Output of <strong>{props.name}</strong>
      </summary>
      {blocks}
      {hidden > 0 ? (
        <p class="muted">
          {hidden} more characters not shown here; GET /v1/runs/{props.runId} has all the trace kept.
        </p>
      ) : null}
      {cut ? (
        <p class="muted">
          The run reached its trace limit (256 KiB of output); later output was counted, not kept.
        </p>
      ) : null}
    </details>
  );
}

export function Trace(props: { run: RunRow; trace: TraceRow[] }) {
  const events = props.trace.filter((e) => e.kind !== "output");
  const outputs = new Map<string, { name: string; chunks: OutputChunk[] }>();
  for (const e of props.trace) {
    if (e.kind !== "output") continue;
    const c = e.detail as OutputChunk | null;
    if (!c || typeof c.sandbox !== "string") continue;
    const group = outputs.get(c.sandbox) ?? { name: String(c.name), chunks: [] };
    group.chunks.push(c);
    outputs.set(c.sandbox, group);
  }
  const spec = readStoredSpec(props.run.spec);
  return (
    <section id="trace">
      <h2>Trace</h2>
      <TraceTable runId={props.run.id} rows={events} />
      <h3>Command output</h3>
      {outputs.size === 0 ? (
        <p class="empty">No command output{isTerminal(props.run.status) ? "." : " yet."}</p>
      ) : (
        [...outputs.values()].map((o) => (
          <SandboxOutput
            runId={props.run.id}
            name={o.name}
            chunks={o.chunks}
            {...commandsFor(spec, o.name)}
          />
        ))
      )}
    </section>
  );
}
