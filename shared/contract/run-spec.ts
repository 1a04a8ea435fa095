import { z } from "zod";
import { BundleHash } from "./bundle";
import { DEFAULT_RESOURCES, type Resources, type SandboxKind } from "./local-agent";
import type { ModelBudget } from "./policy";
import { SetupImageMode } from "./setup-image";

// What a user may ask of a run (the body of POST /v1/runs, a webhook's run template), and the
// form a row keeps it in. Parsed once at the edge (the API, the runs page, a webhook) and
// passed on typed; a stored spec is read back through readStoredSpec, the one migration of what
// older rows hold. The OpenAPI document's names and descriptions ride on zod's own `.meta()`,
// which @hono/zod-openapi reads, so this module needs nothing of the Worker's.

const Command = z.string().min(1).max(8192).meta({ description: "Run by `sh -c` in the sandbox" });
const Commands = z.array(Command).min(1).max(100);
// Run as root of the sandbox, before the wiring is re-proved and the commands run (the setup stage).
// Also a compute-API environment's own setup (src/routes/compute.ts).
export const SetupCommands = z.array(Command).min(1).max(100).meta({
  description:
    "Run by `sh -c` as root of the sandbox before the commands (package installs); through the proxy like everything else",
});

/** The longest a proxy sandbox may linger after its run's commands end. */
export const MAX_LINGER_SECONDS = 24 * 60 * 60;

// Above the cap is its own error code (`linger_too_long`, src/runs/launch.ts), not a generic 400.
export const LingerSeconds = z
  .number()
  .int()
  .min(0)
  .meta({ description: `Seconds, 0 to ${MAX_LINGER_SECONDS} (24 h)`, example: 3600 });

export const TaskSpec = z
  .object({
    name: z
      .string()
      .regex(/^[A-Za-z0-9_.-]{1,64}$/, "1-64 of A-Z a-z 0-9 _ . -")
      .meta({ example: "task-1" }),
    commands: Commands,
    /** This task's own setup, after the run's. */
    setup: SetupCommands.optional(),
  })
  .strict()
  .meta({ id: "TaskSpec" });

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
      .meta({ description: "Memory in MiB; past it the kernel kills", example: 4096 }),
    pids: z
      .number()
      .int()
      .positive()
      .optional()
      .meta({ description: "Processes and threads at once", example: 2048 }),
    cpus: z
      .number()
      .positive()
      .optional()
      .meta({ description: "CPU time as a share of cores (throttled)", example: 2 }),
  })
  .strict()
  .meta({
    id: "RunResources",
    description:
      "Limits of each work, task and orchestrator sandbox (within this deployment's bounds; each field defaults per kind)",
  });
export type RunResources = z.infer<typeof RunResources>;

/**
 * The limits a sandbox of `kind` is made with: each one `asked` sets, the kind's default
 * (DEFAULT_RESOURCES) for the rest. The one place a default is applied: the coordinator for the
 * limits a run asked for, the broker for a request that names none.
 */
export function resourcesFor(asked: RunResources | undefined, kind: SandboxKind): Resources {
  const base = DEFAULT_RESOURCES[kind];
  return {
    memoryMb: asked?.memoryMb ?? base.memoryMb,
    pids: asked?.pids ?? base.pids,
    cpus: asked?.cpus ?? base.cpus,
  };
}

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
    calls: BudgetLimit.optional().meta({ description: "Calls the lane makes upstream", example: 1000 }),
    inputTokens: BudgetLimit.optional().meta({
      description: "Input tokens, as the provider counts them (cached ones included)",
      example: 2_000_000,
    }),
    outputTokens: BudgetLimit.optional().meta({
      description: "Output tokens, as the provider counts them; max tokens is clamped to what is left",
      example: 200_000,
    }),
  })
  .strict()
  .meta({ id: "ModelBudget" });
export type ModelBudgetSpec = z.infer<typeof ModelBudgetSpec>;

export const RunSpec = z
  .object({
    /** A built-in benchmark (src/runs/benchmarks.ts); exclusive with commands. */
    benchmark: z.string().max(64).optional().meta({ example: "demo" }),
    commands: Commands.optional(),
    /**
     * A bundle (POST /v1/bundles) of this environment, by its sha256: unpacked into each work and
     * task sandbox's working directory (/home/sandbox) before setup.
     */
    bundle: BundleHash.optional().meta({
      description:
        "A bundle of this environment (POST /v1/bundles) by its sha256: unpacked into /home/sandbox of each work and task sandbox before setup",
    }),
    /** Setup commands of every work, task and orchestrator sandbox (a task's own follow). */
    setup: SetupCommands.optional(),
    /**
     * use (absent means use): each distinct setup runs once and is kept as a setup image that
     * later sandboxes and runs of this environment start from; rebuild: run it again and replace it.
     */
    setupImage: SetupImageMode.optional().meta({
      description:
        "use (default): start from this environment's setup image when the same setup was kept before; rebuild: run setup again and replace it",
    }),
    resources: RunResources.optional(),
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
  .meta({ id: "RunSpec" });
export type RunSpec = z.infer<typeof RunSpec>;

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

/**
 * A run spec as a row holds it (runs.spec, webhooks.run_template; the coordinator's state keeps
 * one too): every write is a RunSpec, but a row written by an older version may hold the keys of
 * before the camelCase names, or lack a default added since. Typed so that no reader can use it
 * without readStoredSpec.
 */
export type StoredRunSpec = RunSpec | { readonly [key: string]: unknown };

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
 * A stored run spec read back: the one way to read one. It is parsed again so that a row written
 * before a field had its default (egress, onProxyFailure) reads with it, and one written before
 * the camelCase names reads under them. A row that no longer parses is a bug or a missed
 * migration: it throws (naming the fields, never their values).
 */
export function readStoredSpec(stored: StoredRunSpec): RunSpec {
  const parsed = RunSpec.safeParse(withCamelCaseKeys(stored));
  if (parsed.success) return parsed.data;
  const at = parsed.error.issues.map((i) => i.path.join(".") || "(spec)").join(", ");
  throw new Error(`a stored run spec does not parse (at ${at})`);
}
