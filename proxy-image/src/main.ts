// The proxy image's command: `node proxy.cjs [--flag value ...]`, flags and BW_* environment as
// in config.ts. Exit 2 on a bad configuration, 1 on any other failure to start.
import { ConfigError } from "./config";
import { runProxy } from "./run";

runProxy(process.env, process.argv.slice(2)).then(
  ({ shutdown }) => {
    for (const sig of ["SIGINT", "SIGTERM"] as const) {
      process.once(sig, () => void shutdown().then(() => process.exit(0)));
    }
  },
  (e: unknown) => {
    console.error(e instanceof ConfigError ? e.message : `proxy failed to start: ${(e as Error).message}`);
    process.exit(e instanceof ConfigError ? 2 : 1);
  },
);
