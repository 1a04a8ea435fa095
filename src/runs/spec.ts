import { BundleHash } from "@benchwright/shared/contract/bundle";
import { DEFAULT_RESOURCES, Resources, type SandboxKind } from "@benchwright/shared/contract/local-agent";
import type { ModelBudget } from "@benchwright/shared/contract/policy";
import { z } from "@hono/zod-openapi";
import { findBundle } from "../bundles/rows";
import type { Q } from "../db/types";
import { ApiError } from "../errors";
import { DEMO_SCRIPT } from "./demo-script";

// What a user may ask of a run (the body of POST /v1/runs), and the built-in benchmarks a run
// may name instead of inline commands. The validated spec is stored with the run as asked.

const Command = z.string().min(1).max(8192).openapi({ description: "Run by `sh -c` in the sandbox" });
const Commands = z.array(Command).min(1).max(100);
// Run as root of the sandbox, before the wiring is re-proved and the commands run (the setup stage).
const SetupCommands = z.array(Command).min(1).max(100).openapi({
  description:
    "Run by `sh -c` as root of the sandbox before the commands (package installs); through the proxy like everything else",
});

/** The longest a proxy sandbox may linger after its run's commands end. */
export const MAX_LINGER_SECONDS = 24 * 60 * 60;

// Above the cap is its own error code (`linger_too_long`, see lingerTooLong), not a generic 400.
export const LingerSeconds = z
  .number()
  .int()
  .min(0)
  .openapi({ description: `Seconds, 0 to ${MAX_LINGER_SECONDS} (24 h)`, example: 3600 });

export const TaskSpec = z
  .object({
    name: z
      .string()
      .regex(/^[A-Za-z0-9_.-]{1,64}$/, "1-64 of A-Z a-z 0-9 _ . -")
      .openapi({ example: "task-1" }),
    commands: Commands,
    /** This task's own setup, after the run's. */
    setup: SetupCommands.optional(),
  })
  .strict()
  .openapi("TaskSpec");

/** The most a run spec's `resources` may ask of one sandbox (operator settings RESOURCES_MAX_*). */
export interface ResourceBounds {
  readonly memoryMb: number;
  readonly pids: number;
  readonly cpus: number;
}

/** The bounds when the deployment sets none. */
export const DEFAULT_RESOURCE_BOUNDS: ResourceBounds = { memoryMb: 8192, pids: 4096, cpus: 4 };

/**
 * What one work, task or orchestrator sandbox may use (each field optional: the kind's default).
 * Beyond this deployment's bounds (its RESOURCES_MAX_* settings) → resources_out_of_bounds.
 */
export const RunResources = z
  .object({
    memoryMb: z
      .number()
      .int()
      .positive()
      .optional()
      .openapi({ description: "Memory in MiB; past it the kernel kills", example: 4096 }),
    pids: z
      .number()
      .int()
      .positive()
      .optional()
      .openapi({ description: "Processes and threads at once", example: 2048 }),
    cpus: z
      .number()
      .positive()
      .optional()
      .openapi({ description: "CPU time as a share of cores (throttled)", example: 2 }),
  })
  .strict()
  .openapi("RunResources");
export type RunResources = z.infer<typeof RunResources>;

// The contract's bound (ModelBudget): 2^40 tokens is far past any run's spend.
const BudgetLimit = z
  .number()
  .int()
  .positive()
  .max(2 ** 40);

/**
 * What the run may spend through its model lane (each field optional: no limit). Past a limit the
 * lane refuses the call (429, in the caller's format). Only with `model`, else
 * model_budget_without_model.
 */
export const ModelBudgetSpec = z
  .object({
    calls: BudgetLimit.optional().openapi({ description: "Calls the lane makes upstream", example: 1000 }),
    inputTokens: BudgetLimit.optional().openapi({
      description: "Input tokens, as the provider counts them (cached ones included)",
      example: 2_000_000,
    }),
    outputTokens: BudgetLimit.optional().openapi({
      description: "Output tokens, as the provider counts them; max tokens is clamped to what is left",
      example: 200_000,
    }),
  })
  .strict()
  .openapi("ModelBudget");
export type ModelBudgetSpec = z.infer<typeof ModelBudgetSpec>;

export const RunSpec = z
  .object({
    /** A built-in benchmark (see BENCHMARKS); exclusive with commands. */
    benchmark: z.string().max(64).optional().openapi({ example: "demo" }),
    commands: Commands.optional(),
    /**
     * A bundle (POST /v1/bundles) of this environment, by its sha256: unpacked into each work and
     * task sandbox's working directory (/home/sandbox) before setup.
     */
    bundle: BundleHash.optional().openapi({
      description:
        "A bundle of this environment (POST /v1/bundles) by its sha256: unpacked into /home/sandbox of each work and task sandbox before setup",
    }),
    /** Setup commands of every work, task and orchestrator sandbox (a task's own follow). */
    setup: SetupCommands.optional(),
    resources: RunResources.optional().openapi({
      description:
        "Limits of each work, task and orchestrator sandbox (within this deployment's bounds; each field defaults per kind)",
    }),
    /**
     * The model the benchmark evaluates: a vault model's name (GET /v1/vault/models), else the
     * launch is refused (unknown_model). The run's proxy serves it to the commands in OpenAI's
     * and Anthropic's formats; the provider's key stays in the proxy.
     */
    model: z.string().min(1).max(128).optional(),
    modelBudget: ModelBudgetSpec.optional(),
    egress: z.enum(["direct", "local"]).default("direct"),
    /**
     * A run that egresses through the user's machine starts its commands once the egress agent
     * connects; it stops (no code ran) if none did within this many seconds. Default 600.
     */
    egressAgentWaitSeconds: z.number().int().min(1).max(3600).optional(),
    /**
     * Where the run's sandboxes are made: sandbox0 (Kubernetes pods), e2b (microVMs) or local
     * (Linux namespaces, development). Default: the deployment's COMPUTE_BACKEND.
     */
    backend: z.enum(["sandbox0", "e2b", "local"]).optional(),
    /** Fan-out: one task sandbox per task, each running its own commands. */
    tasks: z
      .array(TaskSpec)
      .max(32)
      .optional()
      .refine((t) => !t || new Set(t.map((x) => x.name)).size === t.length, "task names must be unique"),
    /**
     * What to do when the proxy cannot be set up: stop (the default), or go on unfiltered. The
     * latter is honoured only under default routing and always leaves a warning on the run.
     */
    onProxyFailure: z.enum(["stop", "continue"]).default("stop"),
    /**
     * Fan-out tasks running at once (default: all). A task sandbox is made when its turn comes,
     * with the routing the vault asks for then: an edit made meanwhile applies to it.
     */
    maxParallelTasks: z.number().int().min(1).max(32).optional(),
    /**
     * Keep the proxy sandbox this long after the commands end (at most 24 h): it keeps the run's
     * credentials and its view stays inspectable; it pauses when idle. Also settable later with
     * POST /v1/runs/{id}/linger.
     */
    lingerSeconds: LingerSeconds.optional(),
    /**
     * harbor: the Harbor bridge. The commands run in an orchestrator sandbox (the Harbor CLI),
     * which asks the broker for per-task environments through the compute API with the run's
     * capability; exclusive with tasks.
     */
    orchestrator: z.literal("harbor").optional(),
  })
  .strict()
  .refine((s) => s.orchestrator === undefined || s.tasks === undefined, {
    message: "a Harbor run asks for its task environments itself: give no tasks",
    path: ["tasks"],
  })
  .refine((s) => (s.benchmark === undefined) !== (s.commands === undefined), {
    message: "give exactly one of benchmark or commands",
    path: ["commands"],
  })
  .openapi("RunSpec");
export type RunSpec = z.infer<typeof RunSpec>;

/** Built-in benchmarks: a name → the commands it runs. */
export const BENCHMARKS: Readonly<Record<string, readonly string[]>> = {
  demo: [`node -e '${DEMO_SCRIPT.trim()}'`],
};

/**
 * The spec's fields under their names from before the API took one casing (camelCase): rows
 * (and coordinator state) written then hold these keys. They are renamed on read rather than
 * migrated in the database, so old and new rows both read; every write uses the new names.
 */
const SNAKE_CASE_KEYS: Readonly<Record<string, Readonly<Record<string, string>>>> = {
  "": {
    model_budget: "modelBudget",
    egress_agent_wait_seconds: "egressAgentWaitSeconds",
    on_proxy_failure: "onProxyFailure",
    max_parallel_tasks: "maxParallelTasks",
    linger_seconds: "lingerSeconds",
  },
  resources: { memory_mb: "memoryMb" },
  modelBudget: { input_tokens: "inputTokens", output_tokens: "outputTokens" },
};

/** A stored spec with any old snake_case key under its camelCase name (the rest untouched). */
function withCamelCaseKeys(value: unknown, at = ""): unknown {
  const names = SNAKE_CASE_KEYS[at];
  if (!names || !value || typeof value !== "object" || Array.isArray(value)) return value;
  return Object.fromEntries(
    Object.entries(value).map(([k, v]) => {
      const name = names[k] ?? k;
      return [name, at === "" ? withCamelCaseKeys(v, name) : v];
    }),
  );
}

/**
 * A run spec as stored (runs.spec, webhooks.run_template, the coordinator's state), read back:
 * the one way to read one. Every row is written from a validated spec; it is parsed again so
 * that a row written before a field had its default (egress, onProxyFailure) reads with it, and
 * one written before the camelCase names reads under them. A row that no longer parses is a bug
 * or a missed migration: it throws (naming the fields, never their values).
 */
export function storedSpec(stored: RunSpec | unknown): RunSpec {
  const parsed = RunSpec.safeParse(withCamelCaseKeys(stored));
  if (parsed.success) return parsed.data;
  const at = parsed.error.issues.map((i) => i.path.join(".") || "(spec)").join(", ");
  throw new Error(`a stored run spec does not parse (at ${at})`);
}

/** The commands of the work sandbox: the inline ones or the benchmark's. */
export function commandsOf(spec: RunSpec): readonly string[] {
  if (spec.commands) return spec.commands;
  return BENCHMARKS[spec.benchmark ?? ""] ?? [];
}

/** The run's model budget as the lane's contract has it (ModelBudget); null when it set none. */
export function budgetOf(spec: RunSpec): ModelBudget | null {
  const b = spec.modelBudget;
  if (!b) return null;
  return {
    calls: b.calls ?? null,
    inputTokens: b.inputTokens ?? null,
    outputTokens: b.outputTokens ?? null,
  };
}

/** A budget limits the declared model's lane: without a model there is nothing it could limit. */
export function checkModelBudget(spec: RunSpec): void {
  if (spec.modelBudget !== undefined && spec.model === undefined) {
    throw new ApiError(
      "model_budget_without_model",
      "modelBudget limits the run's declared model: give model too, or launch without modelBudget.",
    );
  }
}

/** The 24 h cap has its own code, so a client can tell it from any other invalid field. */
export function checkLinger(seconds: number | undefined): void {
  if (seconds !== undefined && seconds > MAX_LINGER_SECONDS) {
    throw new ApiError(
      "linger_too_long",
      `A proxy may linger at most ${MAX_LINGER_SECONDS} seconds (24 h); ${seconds} were asked for.`,
    );
  }
}

/**
 * The limits of a sandbox of `kind` in this run: the spec's `resources` over the kind's defaults.
 * A proxy sandbox always gets its defaults (the spec's resources are the benchmark's).
 */
export function resourcesOf(spec: RunSpec, kind: SandboxKind): Resources {
  const base = DEFAULT_RESOURCES[kind];
  const asked = kind === "proxy" ? undefined : spec.resources;
  return {
    memoryMb: asked?.memoryMb ?? base.memoryMb,
    pids: asked?.pids ?? base.pids,
    cpus: asked?.cpus ?? base.cpus,
  };
}

/** resources_out_of_bounds unless each asked limit is within the contract's floor and the operator's cap. */
export function checkResources(resources: RunResources | undefined, bounds: ResourceBounds): void {
  if (!resources) return;
  const floor = Resources.shape;
  const fields = [
    ["memoryMb", resources.memoryMb, floor.memoryMb.minValue ?? 0, bounds.memoryMb, "MiB"],
    ["pids", resources.pids, floor.pids.minValue ?? 0, bounds.pids, ""],
    ["cpus", resources.cpus, floor.cpus.minValue ?? 0, bounds.cpus, ""],
  ] as const;
  const wrong = fields.flatMap(([name, value, min, max, unit]) =>
    value === undefined || (value >= min && value <= max)
      ? []
      : [`resources.${name} ${value} is outside ${min}–${max}${unit ? ` ${unit}` : ""}`],
  );
  if (wrong.length > 0) {
    throw new ApiError("resources_out_of_bounds", `${wrong.join("; ")} (this deployment's bounds).`);
  }
}

/**
 * What the schema cannot say about a launch (the API's, a webhook template's and its deliveries',
 * the runs page's): the benchmark must exist, a linger stay within 24 h, the resources within
 * the deployment's bounds, a model budget come with a model, and a named bundle be one of the
 * caller's environment (case H3).
 * Throws the ApiError to answer with.
 */
export async function checkLaunchable(
  db: Q,
  environmentId: string,
  spec: RunSpec,
  bounds: ResourceBounds,
): Promise<void> {
  if (spec.benchmark !== undefined && !Object.hasOwn(BENCHMARKS, spec.benchmark)) {
    throw new ApiError(
      "unknown_benchmark",
      `No benchmark ${JSON.stringify(spec.benchmark)}; known: ${Object.keys(BENCHMARKS).join(", ")}.`,
    );
  }
  checkLinger(spec.lingerSeconds);
  checkModelBudget(spec);
  checkResources(spec.resources, bounds);
  if (spec.bundle !== undefined && !(await findBundle(db, environmentId, spec.bundle))) {
    throw new ApiError(
      "bundle_not_found",
      `No bundle ${spec.bundle} in this environment; upload it with POST /v1/bundles first.`,
    );
  }
}
