import { defaultBackendProblem } from "./broker/backends";
import { type Config, ConfigError, Deployment, loadConfig } from "./config";

// The start-up check of a Worker's settings, on the first request of an isolate (and again on
// each while it fails, so a fixed setting takes effect without a new isolate). In development a
// backend without settings is refused only when a run names it; a staging or production Worker
// whose default backend cannot be made serves nothing: every request is 503 config_invalid
// naming each missing or malformed setting at once (never a value), and logs it.

const checked = new WeakSet<object>();

export function checkSettings(env: Env): Config {
  const problems: string[] = [];
  let config: Config | undefined;
  try {
    config = loadConfig(env);
  } catch (e) {
    if (!(e instanceof ConfigError)) throw e;
    problems.push(e.message);
  }
  // An unknown DEPLOYMENT is named by loadConfig; which backend it would need is unknowable.
  const deployment = Deployment.safeParse(env.DEPLOYMENT || "development");
  if (deployment.success && deployment.data !== "development" && !checked.has(env)) {
    const backend = defaultBackendProblem(env);
    if (backend) problems.push(backend);
  }
  // A setting two checks want (PUBLIC_URL) is named once.
  const named = [...new Set(problems.flatMap((p) => p.split("; ")))];
  if (named.length > 0 || !config) throw new ConfigError(named.join("; "));
  checked.add(env);
  return config;
}
