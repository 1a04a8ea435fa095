import { readFileSync } from "node:fs";
import { Api, ApiError, type Schemas } from "./api";
import { type Config, configPath, readConfig, writeConfig } from "./config";
import { readSecret } from "./io";

// The commands: each takes its parsed arguments and prints either a human summary or, with
// --json, the API's JSON exactly as it answered.

export const DEFAULT_URL = "http://127.0.0.1:8787";

export class UsageError extends Error {}
export class NotLoggedIn extends Error {}

export interface Ctx {
  json: boolean;
  out: (line: string) => void;
  env: NodeJS.ProcessEnv;
}

function api(ctx: Ctx): Api {
  const config = readConfig(configPath(ctx.env));
  if (!config) throw new NotLoggedIn(`not logged in (no ${configPath(ctx.env)}): run benchwright login`);
  return new Api(config.url, config.key);
}

function print(ctx: Ctx, body: unknown, human: () => string[]): void {
  if (ctx.json) ctx.out(JSON.stringify(body, null, 2));
  else for (const line of human()) ctx.out(line);
}

function table(rows: string[][]): string[] {
  const widths = rows[0]?.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? "").length))) ?? [];
  return rows.map((r) =>
    r
      .map((cell, i) => (i === r.length - 1 ? cell : cell.padEnd(widths[i] ?? 0)))
      .join("  ")
      .trimEnd(),
  );
}

export async function login(ctx: Ctx, opts: { url?: string; positionals: string[] }): Promise<void> {
  if (opts.positionals.length > 0) {
    throw new UsageError(
      "an API key is never an argument (shell history, process lists): pipe it, e.g.\n" +
        '  printf %s "$BW_KEY" | benchwright login --url URL\nor run benchwright login and paste it at the prompt',
    );
  }
  const url = (opts.url ?? DEFAULT_URL).replace(/\/+$/, "");
  try {
    new URL(url);
  } catch {
    throw new UsageError(`--url ${url} is not a URL`);
  }
  const key = (await readSecret(`API key for ${url}: `)).trim();
  if (!key) throw new UsageError("no API key was given (standard input was empty)");
  const me = await new Api(url, key).call("get", "/v1/me");
  const config: Config = { url, key };
  const path = configPath(ctx.env);
  writeConfig(path, config);
  print(ctx, me, () => [
    `logged in to ${url} as ${me.userId} (environment ${me.environmentId})`,
    `saved ${path}`,
  ]);
}

export async function whoami(ctx: Ctx): Promise<void> {
  const client = api(ctx);
  const me = await client.call("get", "/v1/me");
  print(ctx, me, () => [
    `url          ${client.url}`,
    `user         ${me.userId}`,
    `environment  ${me.environmentId}`,
    `key          ${me.keyId}`,
  ]);
}

export async function secretsSet(
  ctx: Ctx,
  opts: { positionals: string[]; fromFile?: string },
): Promise<void> {
  const [name, ...extra] = opts.positionals;
  if (!name) throw new UsageError("which secret? benchwright vault secrets set NAME");
  if (extra.length > 0) {
    throw new UsageError(
      "refused: a secret value is never an argument (it would stay in shell history and process lists).\n" +
        `Pipe it:   printf %s "$VALUE" | benchwright vault secrets set ${name}\n` +
        `or a file: benchwright vault secrets set ${name} --from-file PATH\n` +
        `or type it at the prompt: benchwright vault secrets set ${name}`,
    );
  }
  const client = api(ctx);
  let value: string;
  if (opts.fromFile !== undefined) {
    try {
      value = readFileSync(opts.fromFile, "utf8");
    } catch (error) {
      throw new UsageError(`cannot read ${opts.fromFile}: ${(error as NodeJS.ErrnoException).code ?? error}`);
    }
  } else {
    value = await readSecret(`value of ${name}: `);
  }
  if (!value) throw new UsageError("the value is empty");
  let secret: Schemas["SecretInfo"];
  let verb = "created";
  try {
    secret = await client.call("post", "/v1/vault/secrets", { body: { name, value } });
  } catch (error) {
    if (!(error instanceof ApiError && error.code === "secret_exists")) throw error;
    const { secrets } = await client.call("get", "/v1/vault/secrets");
    const existing = secrets.find((s) => s.name === name);
    if (!existing) throw error;
    secret = await client.call("put", "/v1/vault/secrets/{id}", {
      params: { id: existing.id },
      body: { value },
    });
    verb = "updated";
  }
  print(ctx, secret, () => [`${verb} ${secret.name} (${secret.id}, fingerprint ${secret.fingerprint})`]);
}

export async function secretsList(ctx: Ctx): Promise<void> {
  const body = await api(ctx).call("get", "/v1/vault/secrets");
  print(ctx, body, () =>
    body.secrets.length === 0
      ? ["no secrets"]
      : table([
          ["NAME", "ID", "FINGERPRINT", "UPDATED"],
          ...body.secrets.map((s) => [s.name, s.id, s.fingerprint, s.updatedAt]),
        ]),
  );
}

export async function runsLaunch(
  ctx: Ctx,
  opts: {
    commands: string[];
    benchmark?: string;
    model?: string;
    egress?: string;
    backend?: string;
  },
): Promise<void> {
  if (opts.commands.length === 0 && !opts.benchmark) {
    throw new UsageError("what to run? benchwright runs launch -- <command> or --benchmark NAME");
  }
  if (opts.commands.length > 0 && opts.benchmark) {
    throw new UsageError("give either commands or --benchmark, not both");
  }
  if (opts.egress !== undefined && opts.egress !== "direct" && opts.egress !== "local") {
    throw new UsageError("--egress is direct or local");
  }
  if (opts.backend !== undefined && !["sandbox0", "e2b", "local"].includes(opts.backend)) {
    throw new UsageError("--backend is sandbox0, e2b or local");
  }
  const spec: Schemas["RunSpec"] = {
    egress: (opts.egress as Schemas["RunSpec"]["egress"] | undefined) ?? "direct",
    on_proxy_failure: "stop",
    ...(opts.benchmark ? { benchmark: opts.benchmark } : { commands: opts.commands }),
    ...(opts.model ? { model: opts.model } : {}),
    ...(opts.backend ? { backend: opts.backend as Schemas["RunSpec"]["backend"] } : {}),
  };
  const run = await api(ctx).call("post", "/v1/runs", { body: spec });
  print(ctx, run, () => [
    `${run.id} ${run.status} (backend ${run.backend})`,
    ...(run.egressAgent
      ? [
          "this run egresses through your machine; run its egress agent (the token is shown only now):",
          `  ${run.egressAgent.command}`,
        ]
      : []),
    `follow it: benchwright runs show ${run.id}`,
  ]);
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
    ];
    if (run.notes.length > 0) {
      lines.push("notes");
      for (const n of run.notes) lines.push(`  [${n.level}] ${n.code}: ${n.text}`);
    }
    if (run.sandboxes.length > 0) {
      lines.push("sandboxes");
      for (const s of run.sandboxes) lines.push(`  ${s.id} ${s.kind} ${s.status}`);
    }
    const output = run.trace.filter((e) => e.kind === "output");
    if (output.length > 0) {
      lines.push("output");
      for (const e of output) {
        const d = e.detail as { stream?: string; text?: string; command?: number; exitCode?: number | null };
        if (typeof d?.text === "string") {
          const tag = d.stream === "stderr" ? "! " : "  ";
          for (const line of d.text.replace(/\n$/, "").split("\n")) lines.push(`${tag}${line}`);
        } else if (d && "exitCode" in d) {
          lines.push(`  (command ${d.command ?? "?"} exited ${d.exitCode ?? "by a signal"})`);
        }
      }
    }
    return lines;
  });
}

export async function runsCancel(ctx: Ctx, id: string): Promise<void> {
  const run = await api(ctx).call("post", "/v1/runs/{id}/cancel", { params: { id } });
  print(ctx, run, () => [`${run.id} cancel requested (status ${run.status})`]);
}

export async function blockedHosts(ctx: Ctx, id: string, page: { limit?: number; cursor?: string }) {
  const body = await api(ctx).call("get", "/v1/runs/{id}/blocked-hosts", { params: { id }, query: page });
  print(ctx, body, () => [
    ...(body.blockedHosts.length === 0
      ? ["no hosts were refused"]
      : table([
          ["HOST", "COUNT", "SOURCE", "LAST SEEN"],
          ...body.blockedHosts.map((h) => [h.host, String(h.seenCount), h.source, h.lastSeen]),
        ])),
    ...(body.nextCursor ? [`more: --cursor ${body.nextCursor}`] : []),
  ]);
}

export async function egressRoutes(ctx: Ctx, id: string, page: { limit?: number; cursor?: string }) {
  const body = await api(ctx).call("get", "/v1/runs/{id}/egress-routes", { params: { id }, query: page });
  print(ctx, body, () => [
    ...(body.egressRoutes.length === 0
      ? ["no traffic recorded"]
      : table([
          ["HOST", "ROUTE", "COUNT", "LAST SEEN"],
          ...body.egressRoutes.map((r) => [r.host, r.route, String(r.count), r.lastSeen]),
        ])),
    ...(body.nextCursor ? [`more: --cursor ${body.nextCursor}`] : []),
  ]);
}
