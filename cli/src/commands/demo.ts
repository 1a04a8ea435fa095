import { follow } from "./follow";
import { asSpec } from "./runs";
import { api, type Ctx, Failed, print } from "./shared";

// `benchwright demo`: what `npm start` shows, from the CLI. It launches the built-in `demo`
// benchmark (it calls api.demo.test without a key and tries blocked.demo.test), follows it, and
// reads back from the API what the boundary did. It needs the vault `npm start` sets up for its
// dev user, and the demo upstream it runs: log in with that user's key (.data/dev-api-key).

interface DemoLine {
  api?: { status?: number; body?: { keyMatches?: boolean } | null; error?: string };
  blocked?: { status?: number; error?: string };
  envNames?: string[];
  placeholders?: string[];
}

/**
 * Whether the demo's environment held no variable about the demo key but its placeholder: the
 * vault's DEMO_API_KEY reaches the sandbox only as `bw-placeholder-…` (case N1), never as the key.
 * `npm start` (scripts/start.ts) asks the same of the same line.
 */
export function noSecretInDemoEnv(line: Pick<DemoLine, "envNames" | "placeholders"> | null): boolean {
  if (!Array.isArray(line?.envNames)) return false;
  return !line.envNames.some((n) => /DEMO/i.test(n) && !(line.placeholders ?? []).includes(n));
}

export async function demo(ctx: Ctx): Promise<void> {
  const client = api(ctx);
  const { rules } = await client.call("get", "/v1/vault/rules");
  if (!rules.some((r) => r.host === "api.demo.test")) {
    throw new Failed(
      "this vault has no rule for api.demo.test: the demo runs on the stack `npm start` brings up, as its\n" +
        "dev user (benchwright login --url http://127.0.0.1:8787 < .data/dev-api-key)",
    );
  }
  const launched = await client.call("post", "/v1/runs", { body: asSpec({ benchmark: "demo" }) });
  ctx.err(
    `launched ${launched.id}: the demo calls api.demo.test without a key, then tries blocked.demo.test`,
  );
  const run = await follow({ ...ctx, json: false, out: ctx.json ? () => {} : ctx.out }, client, launched.id);
  const stdout = run.trace
    .filter((e) => e.kind === "output" && (e.detail as { stream?: string })?.stream === "stdout")
    .map((e) => String((e.detail as { text?: string }).text ?? ""))
    .join("");
  const line = stdout.split("\n").find((l) => l.startsWith('{"demo"'));
  let seen: DemoLine = {};
  try {
    seen = line ? (JSON.parse(line) as DemoLine) : {};
  } catch {}
  // The proxy reports refusals in batches: give the last one a few seconds to land.
  let blockedHosts: { host: string; seenCount: number }[] = [];
  for (let tries = 0; tries < 20; tries++) {
    ({ blockedHosts } = await client.call("get", "/v1/runs/{id}/blocked-hosts", { params: { id: run.id } }));
    if (blockedHosts.length > 0) break;
    await new Promise((r) => setTimeout(r, 500));
  }
  const checks = {
    keyInjected: seen.api?.status === 200 && seen.api.body?.keyMatches === true,
    noSecretInSandboxEnv: noSecretInDemoEnv(seen),
    blockedRefused: seen.blocked?.status === 403,
    blockedRecorded: blockedHosts.some((h) => h.host === "blocked.demo.test"),
  };
  const yes = (ok: boolean) => (ok ? "yes" : "NO");
  print(
    ctx,
    { runId: run.id, status: run.status, reason: run.reason, routing: run.routing, checks, blockedHosts },
    () => [
      "",
      `demo run ${run.id}: ${run.status} (${run.reason}), routing ${run.routing}`,
      `  the sandbox sent no key; the demo API saw the vault's key ...... ${yes(checks.keyInjected)}`,
      `  no secret in the sandbox's environment ......................... ${yes(checks.noSecretInSandboxEnv)}`,
      `  blocked.demo.test refused (HTTP ${seen.blocked?.status ?? "?"}) ........................ ${yes(checks.blockedRefused)}`,
      `  ... and recorded: ${blockedHosts.map((b) => `${b.host} ×${b.seenCount}`).join(", ") || "(not yet)"}`,
    ],
  );
  if (!Object.values(checks).every(Boolean))
    throw new Failed("the demo did not show what it should (see NO above)");
}
