// The proxy image's command: `node proxy.cjs [--flag value ...]`, flags and BW_* environment as
// in config.ts. Exit 2 on a bad configuration, 1 on any other failure to start.
//
// `node proxy.cjs view` (bw-proxy-view) instead prints the running proxy's view (GET /view on
// 127.0.0.1:BW_VIEW_PORT, shared/contract/proxy-view.ts) as one JSON line and exits 0; on any
// failure it prints one line on stderr and exits 1. It never starts a proxy.
import { logLine } from "@benchwright/shared/contract/log";
import { ProxyView, VIEW_PATH } from "@benchwright/shared/contract/proxy-view";
import { ConfigError, viewPort } from "./config";
import { runProxy } from "./run";

/** Bounds the whole read: a paused (frozen) proxy does not answer until it is resumed. */
const VIEW_TIMEOUT_MS = 10_000;

async function printView(env: NodeJS.ProcessEnv): Promise<string> {
  const url = `http://127.0.0.1:${viewPort(env)}${VIEW_PATH}`;
  let res: Response;
  try {
    res = await fetch(url, { signal: AbortSignal.timeout(VIEW_TIMEOUT_MS), redirect: "error" });
  } catch (e) {
    const err = e as Error & { cause?: { code?: string } };
    const why = err.name === "TimeoutError" ? `no answer within ${VIEW_TIMEOUT_MS / 1000} s` : undefined;
    throw new Error(`cannot read the proxy's view at ${url}: ${why ?? err.cause?.code ?? err.message}`);
  }
  const text = await res.text();
  if (!res.ok) throw new Error(`the proxy's view at ${url} answered HTTP ${res.status}`);
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    throw new Error(`the proxy's view at ${url} is not JSON`);
  }
  const view = ProxyView.safeParse(body);
  if (!view.success) {
    const issue = view.error.issues[0];
    throw new Error(`the proxy's view is outside its contract: ${issue?.path.join(".")}: ${issue?.message}`);
  }
  return JSON.stringify(view.data);
}

function exit(code: number, stream: NodeJS.WriteStream, line: string): void {
  // Exit once the line is written: an idle keep-alive socket would otherwise hold the process.
  stream.write(`${line.replaceAll("\n", " ")}\n`, () => process.exit(code));
}

if (process.argv[2] === "view") {
  printView(process.env).then(
    (line) => exit(0, process.stdout, line),
    (e: unknown) => exit(1, process.stderr, `bw-proxy-view: ${(e as Error).message}`),
  );
} else {
  runProxy(process.env, process.argv.slice(2)).then(
    ({ shutdown }) => {
      for (const sig of ["SIGINT", "SIGTERM"] as const) {
        process.once(sig, () => void shutdown().then(() => process.exit(0)));
      }
    },
    (e: unknown) => {
      // One log line like the rest, the message as its detail (a run's reason may quote it).
      const detail = e instanceof ConfigError ? e.message : `proxy failed to start: ${(e as Error).message}`;
      console.error(logLine("error", { event: "proxy_start_failed", detail }));
      process.exit(e instanceof ConfigError ? 2 : 1);
    },
  );
}
