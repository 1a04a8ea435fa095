import { readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { ApiError, NetworkError, type Schemas } from "../api";
import { uploadFolder } from "./bundles";
import { eventLines, follow } from "./follow";
import { api, type Ctx, nextPage, oneOf, print, SPEC_FILE, table, UsageError } from "./shared";

// `benchwright runs ...`: launch (inline commands, a built-in benchmark, or a benchmark folder's
// benchwright.json), follow (./follow.ts), show, list, and the controls: cancel, halt,
// resume, linger.

/**
 * A run spec as the user writes it. The generated type marks fields with a default (egress,
 * onProxyFailure) as required, since the API's answers always carry them; a request may omit
 * them and the API fills them in.
 */
export type SpecInput = Partial<Schemas["RunSpec"]>;
export const asSpec = (spec: SpecInput) => spec as Schemas["RunSpec"];

/** A benchmark folder's spec file, or a JSON file: the spec, and whether it came from a folder. */
function readSpecFrom(path: string): { spec: SpecInput; folder: string | null } {
  let file = path;
  let folder: string | null = null;
  try {
    if (statSync(path).isDirectory()) {
      folder = path;
      file = join(path, SPEC_FILE);
    }
  } catch (error) {
    throw new UsageError(`cannot read ${path}: ${(error as NodeJS.ErrnoException).code ?? error}`);
  }
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    throw new UsageError(
      `cannot read ${file}: ${(error as NodeJS.ErrnoException).code ?? error} (a benchmark folder has a ${SPEC_FILE})`,
    );
  }
  let spec: unknown;
  try {
    spec = JSON.parse(text);
  } catch (error) {
    throw new UsageError(`${file} is not JSON: ${(error as Error).message}`);
  }
  if (typeof spec !== "object" || spec === null || Array.isArray(spec)) {
    throw new UsageError(`${file} must hold one JSON object (a run spec; see docs/user-guide.md)`);
  }
  // The API checks the rest, and answers with the field it refuses.
  return { spec: spec as SpecInput, folder };
}

/** The spec's `files` (the CLI's own field: what to pack), checked and taken out of the spec. */
function takeFiles(spec: SpecInput & { files?: unknown }): { spec: SpecInput; files?: string[] } {
  const { files, ...rest } = spec;
  if (files === undefined) return { spec: rest };
  if (!Array.isArray(files) || files.length === 0 || !files.every((f) => typeof f === "string" && f !== "")) {
    throw new UsageError(
      `"files" in ${SPEC_FILE} is a non-empty list of paths or gitignore-style patterns (e.g. ["*.py", "data/"])`,
    );
  }
  return { spec: rest, files };
}

/**
 * The words after `--` as one `sh -c` command. One word is taken as a shell command as it is
 * (`-- 'make && ./run'`); several keep their boundaries (`-- node -e 'console.log(1)'`), each
 * quoted for sh unless it is plain, as the user's own shell already split them.
 */
export function commandOf(words: string[]): string {
  if (words.length === 1) return words[0] as string;
  return words
    .map((w) => (/^[A-Za-z0-9_@%+=:,./-]+$/.test(w) ? w : `'${w.replaceAll("'", `'\\''`)}'`))
    .join(" ");
}

export interface LaunchOptions {
  commands: string[];
  benchmark?: string;
  from?: string;
  model?: string;
  /** --budget calls=N,input=N,output=N: the run's modelBudget. */
  budget?: string;
  egress?: string;
  backend?: string;
  linger?: string;
  follow: boolean;
  /** Credential-looking files of the --from folder to pack all the same (relative to it). */
  includeSecretFiles?: string[];
}

export async function runsLaunch(ctx: Ctx, opts: LaunchOptions): Promise<void> {
  const sources = [opts.commands.length > 0, opts.benchmark !== undefined, opts.from !== undefined].filter(
    Boolean,
  );
  if (sources.length === 0) {
    throw new UsageError(
      "what to run? benchwright runs launch -- <command>, --benchmark NAME or --from FOLDER",
    );
  }
  if (sources.length > 1) throw new UsageError("give one of: commands, --benchmark, --from");
  const egress = oneOf(opts.egress, ["direct", "local"] as const, "--egress");
  const backend = oneOf(opts.backend, ["sandbox0", "e2b", "local"] as const, "--backend");
  const secretFiles = opts.includeSecretFiles ?? [];
  const read = opts.from ? readSpecFrom(opts.from) : null;
  if (secretFiles.length > 0 && !read?.folder) {
    throw new UsageError("--include-secret-file names a file of the --from FOLDER that is packed");
  }
  const client = api(ctx);
  let base: SpecInput;
  if (read?.folder) {
    // A folder's files go with it: packed (the spec's `files` say what), uploaded, and named in
    // the spec by their hash. `files` is the CLI's own field; the API never sees it.
    const { spec: rest, files } = takeFiles(read.spec);
    if (rest.bundle !== undefined) {
      throw new UsageError(
        `${SPEC_FILE} names a bundle, and --from FOLDER packs the folder as one: drop "bundle", or launch --from ${join(read.folder, SPEC_FILE)} (the file alone, nothing packed)`,
      );
    }
    const bundle = await uploadFolder(ctx, client, read.folder, { files, includeSecretFiles: secretFiles });
    base = bundle ? { ...rest, bundle: bundle.sha256 } : rest;
  } else {
    if (read && "files" in read.spec) {
      throw new UsageError(`"files" says what to pack from a benchmark folder: give --from the folder`);
    }
    base = read ? read.spec : opts.benchmark ? { benchmark: opts.benchmark } : { commands: opts.commands };
  }
  const spec: SpecInput = {
    ...base,
    ...(opts.model ? { model: opts.model } : {}),
    ...(opts.budget !== undefined ? { modelBudget: modelBudget(opts.budget) } : {}),
    ...(egress ? { egress } : {}),
    ...(backend ? { backend } : {}),
    ...(opts.linger !== undefined ? { lingerSeconds: seconds(opts.linger, "--linger") } : {}),
  };
  // One Idempotency-Key for the launch and its retries: a launch whose answer was lost is
  // answered again by the API, never made twice.
  const launch = { body: asSpec(spec), headers: { "idempotency-key": crypto.randomUUID() } };
  let run: Awaited<ReturnType<typeof client.call<"/v1/runs", "post">>>;
  let withheld = "";
  const seen = (h: Headers) => {
    withheld = h.get("idempotent-withheld") ?? "";
  };
  for (let attempt = 1; ; attempt++) {
    try {
      run = await client.call("post", "/v1/runs", { ...launch, seen });
      break;
    } catch (error) {
      const again =
        error instanceof NetworkError ||
        (error instanceof ApiError && (error.status >= 500 || error.code === "idempotency_key_in_use"));
      if (!again || attempt === 3) throw error;
      await new Promise((r) => setTimeout(r, attempt * 1000));
    }
  }
  // A retry answered by the replay of a launch whose answer was lost: the API keeps no copy of
  // the agent's token (case L5), so ask for a new one (it replaces the lost one). A run that has
  // ended since needs no agent.
  if (!run.egressAgent && withheld.split(", ").includes("egressAgent")) {
    try {
      const fresh = await client.call("post", "/v1/runs/{id}/egress-agent-token", { params: { id: run.id } });
      run = { ...run, egressAgent: fresh };
    } catch (error) {
      if (!(error instanceof ApiError && error.code === "run_ended")) throw error;
    }
  }
  const agent = run.egressAgent
    ? [
        "this run egresses through your machine; run its egress agent (the token is shown only now):",
        `  ${run.egressAgent.command}`,
      ]
    : [];
  if (!opts.follow) {
    print(ctx, run, () => [
      `${run.id} ${run.status} (backend ${run.backend})`,
      ...agent,
      `follow it: benchwright runs follow ${run.id}`,
    ]);
    return;
  }
  // The agent's command goes to standard error too: with --json, standard output is the run.
  for (const line of [`launched ${run.id} (backend ${run.backend})`, ...agent]) ctx.err(line);
  await follow(ctx, client, run.id);
}

const BUDGET_KEYS = { calls: "calls", input: "inputTokens", output: "outputTokens" } as const;

/**
 * --budget calls=1000,input=2m,output=200k: the run's modelBudget (k and m multiply by a
 * thousand and a million). The API checks the rest (positive, and only with a model).
 */
export function modelBudget(text: string): NonNullable<SpecInput["modelBudget"]> {
  const budget: Record<string, number> = {};
  for (const part of text.split(",")) {
    const m = /^\s*(calls|input|output)\s*=\s*(\d+)([km]?)\s*$/i.exec(part);
    if (!m)
      throw new UsageError(
        "--budget takes calls=N,input=N,output=N (any of them; e.g. calls=1000,output=200k)",
      );
    const key = BUDGET_KEYS[(m[1] as string).toLowerCase() as keyof typeof BUDGET_KEYS];
    budget[key] =
      Number(m[2]) *
      ({ "": 1, k: 1_000, m: 1_000_000 }[(m[3] as string).toLowerCase() as "" | "k" | "m"] ?? 1);
  }
  return budget;
}

/** "90", "90s", "15m", "2h" → seconds. */
export function seconds(text: string, flag: string): number {
  const m = /^(\d+)([smh]?)$/.exec(text.trim());
  if (!m) throw new UsageError(`${flag} takes seconds, or a number with s, m or h (e.g. 15m)`);
  const n = Number(m[1]) * ({ "": 1, s: 1, m: 60, h: 3600 }[m[2] as "" | "s" | "m" | "h"] ?? 1);
  if (n > 86_400) throw new UsageError(`${flag} is at most 24h`);
  return n;
}

export async function runsFollow(ctx: Ctx, id: string): Promise<void> {
  await follow(ctx, api(ctx), id);
}

export async function runsShow(ctx: Ctx, id: string): Promise<void> {
  const run = await api(ctx).call("get", "/v1/runs/{id}", { params: { id } });
  print(ctx, run, () => {
    const lines = [
      `run       ${run.id}`,
      `status    ${run.status}${run.halted ? " (halted)" : ""}`,
      ...(run.reason ? [`reason    ${run.reason}${run.reasonDetail ? `: ${run.reasonDetail}` : ""}`] : []),
      `backend   ${run.backend}`,
      `routing   ${run.routing ?? "-"}`,
      `created   ${run.createdAt}`,
      ...(run.startedAt ? [`started   ${run.startedAt}`] : []),
      ...(run.endedAt ? [`ended     ${run.endedAt}`] : []),
      ...(run.linger.until
        ? [`lingers   until ${run.linger.until}${run.linger.paused ? " (paused)" : ""}`]
        : []),
    ];
    if (run.notes.length > 0) {
      lines.push("notes");
      for (const n of run.notes) lines.push(`  [${n.level}] ${n.code}: ${n.text}`);
    }
    if (run.sandboxes.length > 0) {
      lines.push("sandboxes");
      for (const s of run.sandboxes) lines.push(`  ${s.id} ${s.kind} ${s.status}`);
    }
    const output = run.trace.filter((e) => e.kind === "output").flatMap(eventLines);
    if (output.length > 0) lines.push("output", ...output);
    return lines;
  });
}

export async function runsList(ctx: Ctx, page: { limit?: number; cursor?: string }): Promise<void> {
  const body = await api(ctx).call("get", "/v1/runs", { query: page });
  print(ctx, body, () => [
    ...(body.runs.length === 0
      ? ["no runs"]
      : table([
          ["ID", "STATUS", "REASON", "BACKEND", "CREATED"],
          ...body.runs.map((r) => [r.id, r.status, r.reason ?? "-", r.backend, r.createdAt]),
        ])),
    ...nextPage(body.nextCursor),
  ]);
}

type Control = "cancel" | "halt" | "resume";
const CONTROL_SAYS: Record<Control, string> = {
  cancel: "cancel requested",
  halt: "halted: its commands stop; the proxy keeps enforcing (benchwright runs resume goes on)",
  resume: "resumed",
};

export async function runsControl(ctx: Ctx, verb: Control, id: string): Promise<void> {
  const client = api(ctx);
  const run =
    verb === "cancel"
      ? await client.call("post", "/v1/runs/{id}/cancel", { params: { id } })
      : verb === "halt"
        ? await client.call("post", "/v1/runs/{id}/halt", { params: { id }, body: {} })
        : await client.call("post", "/v1/runs/{id}/resume", { params: { id }, body: {} });
  print(ctx, run, () => [`${run.id} ${CONTROL_SAYS[verb]} (status ${run.status})`]);
}

export async function runsLinger(ctx: Ctx, id: string, window: string): Promise<void> {
  const s = seconds(window, "the window");
  const run = await api(ctx).call("post", "/v1/runs/{id}/linger", { params: { id }, body: { seconds: s } });
  print(ctx, run, () => [
    s === 0
      ? `${run.id}: its proxy no longer lingers (status ${run.status})`
      : `${run.id}: its proxy lingers ${s} s after its commands end (status ${run.status})`,
  ]);
}
