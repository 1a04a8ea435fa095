import { ApiError } from "../errors";
import { BackendError, BackendName, type ComputeBackend } from "./backend";
import { e2bFromEnv } from "./e2b/backend";
import { localFromEnv } from "./local-backend";
import { sandbox0FromEnv } from "./sandbox0/backend";

// Which compute backends this deployment has, from the Worker's env. A run names one (or takes
// COMPUTE_BACKEND, the deployment's default); a backend whose settings are missing is refused at
// launch, never replaced by another one.

const FROM_ENV: Record<BackendName, (env: Env) => ComputeBackend | string> = {
  sandbox0: sandbox0FromEnv,
  e2b: e2bFromEnv,
  local: localFromEnv,
};

/** The deployment's default backend (COMPUTE_BACKEND; `local` when unset). */
export function defaultBackend(env: Env): BackendName {
  const parsed = BackendName.safeParse(env.COMPUTE_BACKEND || "local");
  if (!parsed.success) {
    throw new BackendError(
      "backend_not_configured",
      `COMPUTE_BACKEND must be one of ${BackendName.options.join(", ")}`,
    );
  }
  return parsed.data;
}

/** The named backend, or BackendError backend_not_configured saying which setting is missing. */
export function backendFor(env: Env, name: string): ComputeBackend {
  const known = BackendName.safeParse(name);
  if (!known.success) throw new BackendError("backend_not_configured", `no compute backend named ${name}`);
  const made = FROM_ENV[known.data](env);
  if (typeof made === "string") {
    throw new BackendError("backend_not_configured", `the ${known.data} backend is not configured: ${made}`);
  }
  return made;
}

/**
 * What the deployment's default backend still lacks (its settings named, never their values), or
 * undefined when it can be made: the start-up check of a deployment (src/settings-check.ts).
 */
export function defaultBackendProblem(env: Env): string | undefined {
  const name = BackendName.safeParse(env.COMPUTE_BACKEND || "local");
  if (!name.success) return `COMPUTE_BACKEND must be one of ${BackendName.options.join(", ")}`;
  const made = FROM_ENV[name.data](env);
  return typeof made === "string" ? made : undefined;
}

/** Every backend this deployment has settings for (the orphan sweep asks each). */
export function configuredBackends(env: Env): ComputeBackend[] {
  return BackendName.options.flatMap((name) => {
    const made = FROM_ENV[name](env);
    return typeof made === "string" ? [] : [made];
  });
}

/**
 * The backend a run launched now is recorded with. A backend the launch names must be configured
 * here (400 backend_not_configured otherwise). The default is taken as it is: if its settings
 * are missing the run stops with that reason before any sandbox is made, as the operator's
 * problem, and the run page says so.
 */
export function backendForLaunch(env: Env, asked: BackendName | undefined): BackendName {
  if (asked === undefined) return (env.COMPUTE_BACKEND || "local") as BackendName;
  const made = FROM_ENV[asked](env);
  if (typeof made === "string") {
    throw new ApiError(
      "backend_not_configured",
      `The ${asked} backend is not configured on this deployment.`,
    );
  }
  return asked;
}
