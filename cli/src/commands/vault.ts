import { readFileSync } from "node:fs";
import { type Api, ApiError, type Schemas } from "../api";
import { readSecret } from "../io";
import { api, type Ctx, oneOf, print, table, UsageError } from "./shared";

// `benchwright vault ...`: secrets (values in, never out), rules, host entries, the default, the
// starter pack, the compiled policy's preview and the dry run of edits against a past run.

type HostEntry = Schemas["HostEntry"];
const INJECT = ["bearer", "basic", "raw", "query"] as const;
const ACTIONS = ["allow", "block"] as const;
const VIA = ["direct", "tunnel"] as const;

// ---- secrets ----

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
    const existing = await secretNamed(client, name);
    if (!existing) throw error;
    secret = await client.call("put", "/v1/vault/secrets/{id}", {
      params: { id: existing.id },
      body: { value },
    });
    verb = "updated";
  }
  print(ctx, secret, () => [`${verb} ${secret.name} (${secret.id}, fingerprint ${secret.fingerprint})`]);
}

async function secretNamed(client: Api, name: string) {
  const { secrets } = await client.call("get", "/v1/vault/secrets");
  return secrets.find((s) => s.name === name);
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

export async function secretsDelete(ctx: Ctx, name: string): Promise<void> {
  const client = api(ctx);
  const secret = await secretNamed(client, name);
  if (!secret) throw new ApiError(404, "not_found", `No secret named ${name}.`, null);
  await client.call("delete", "/v1/vault/secrets/{id}", { params: { id: secret.id } });
  print(ctx, { deleted: secret.id, name }, () => [`deleted ${name} (${secret.id})`]);
}

// ---- limits and placeholders ----

/** Limit flags as typed: a comma-separated list; "any" is no limit (null); absent: unchanged. */
export interface LimitFlags {
  methods?: string | undefined;
  paths?: string | undefined;
}

function limitList(text: string | undefined, flag: string): string[] | null | undefined {
  if (text === undefined) return undefined;
  if (text.trim() === "any") return null;
  const items = text
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "");
  if (items.length === 0) throw new UsageError(`${flag} takes a comma-separated list, or "any" for no limit`);
  return items;
}

/** The limits a body carries: only the flags given (the API checks each item). */
function limitsBody(flags: LimitFlags) {
  const methods = limitList(flags.methods, "--methods");
  const paths = limitList(flags.paths, "--paths");
  return { ...(methods === undefined ? {} : { methods }), ...(paths === undefined ? {} : { paths }) };
}

/** A limits column: "GET,HEAD /a,/b", or "-" for none. */
const limitsText = (x: { methods: string[] | null; paths: string[] | null }) =>
  [x.methods?.join(","), x.paths?.join(",")].filter(Boolean).join(" ") || "-";

export interface PlaceholderFlags {
  placeholderEnv?: string | undefined;
  noPlaceholder?: boolean | undefined;
  placeholderIn?: string | undefined;
}

function placeholderBody(flags: PlaceholderFlags) {
  if (flags.noPlaceholder && flags.placeholderEnv !== undefined) {
    throw new UsageError("give --placeholder-env NAME or --no-placeholder, not both");
  }
  const place = oneOf(flags.placeholderIn, ["body", "none"] as const, "--placeholder-in");
  return {
    ...(flags.noPlaceholder ? { placeholderEnv: null } : {}),
    ...(flags.placeholderEnv === undefined ? {} : { placeholderEnv: flags.placeholderEnv }),
    ...(place === undefined ? {} : { placeholderIn: place === "body" ? ["body" as const] : [] }),
  };
}

// ---- rules ----

function ruleLines(rules: Schemas["Rule"][]): string[] {
  if (rules.length === 0) return ["no rules"];
  return table([
    ["#", "HOST", "SECRET", "INJECT", "PLACEHOLDER", "LIMITS", "ID"],
    ...rules.map((r) => [
      String(r.position),
      r.host,
      r.secret,
      r.inject.scheme === "query" ? `query ?${r.inject.name}=` : `${r.inject.scheme} (${r.inject.name})`,
      (r.placeholderEnv ?? "-") + (r.placeholderIn.includes("body") ? " (+body)" : ""),
      limitsText(r),
      r.id,
    ]),
  ]);
}

export async function rulesList(ctx: Ctx): Promise<void> {
  const body = await api(ctx).call("get", "/v1/vault/rules");
  print(ctx, body, () => ruleLines(body.rules));
}

export async function rulesAdd(
  ctx: Ctx,
  host: string,
  opts: { secret?: string; inject?: string; name?: string; position?: number } & LimitFlags &
    PlaceholderFlags,
): Promise<void> {
  if (!opts.secret) throw new UsageError("which secret does the rule inject? --secret NAME");
  const scheme = oneOf(opts.inject ?? "bearer", INJECT, "--inject");
  if ((scheme === "raw" || scheme === "query") && !opts.name) {
    throw new UsageError(
      `--inject ${scheme} needs --name (the ${scheme === "raw" ? "header" : "query parameter"})`,
    );
  }
  const rule = await api(ctx).call("post", "/v1/vault/rules", {
    body: {
      host,
      secret: opts.secret,
      inject: { scheme: scheme as (typeof INJECT)[number], ...(opts.name ? { name: opts.name } : {}) },
      ...(opts.position === undefined ? {} : { position: opts.position }),
      ...limitsBody(opts),
      ...placeholderBody(opts),
    },
  });
  print(ctx, rule, () => [`added rule ${rule.id}: ${rule.host} gets ${rule.secret} (${rule.inject.scheme})`]);
}

/** Changes a rule's limits and placeholder (flags not given stay as they are). */
export async function rulesUpdate(
  ctx: Ctx,
  which: string,
  opts: LimitFlags & PlaceholderFlags,
): Promise<void> {
  const body = { ...limitsBody(opts), ...placeholderBody(opts) };
  if (Object.keys(body).length === 0) {
    throw new UsageError(
      "nothing to change: --methods, --paths, --placeholder-env, --no-placeholder, --placeholder-in",
    );
  }
  const client = api(ctx);
  const id = await ruleId(client, which);
  const rule = await client.call("patch", "/v1/vault/rules/{id}", { params: { id }, body });
  print(ctx, rule, () => [
    `updated rule ${rule.id}: ${rule.host}, placeholder ${rule.placeholderEnv ?? "none"}, limits ${limitsText(rule)}`,
  ]);
}

/** A rule's id: given, or the one rule naming a host. */
async function ruleId(client: Api, which: string): Promise<string> {
  if (which.startsWith("rul_")) return which;
  const { rules } = await client.call("get", "/v1/vault/rules");
  const matching = rules.filter((r) => r.host === which);
  if (matching.length === 0) throw new ApiError(404, "not_found", `No rule for host ${which}.`, null);
  if (matching.length > 1) {
    throw new UsageError(
      `${matching.length} rules name ${which}; give a rule id: ${matching.map((r) => r.id).join(", ")}`,
    );
  }
  return (matching[0] as Schemas["Rule"]).id;
}

/** By id, or by host when exactly one rule names it. */
export async function rulesRemove(ctx: Ctx, which: string): Promise<void> {
  const client = api(ctx);
  const id = await ruleId(client, which);
  await client.call("delete", "/v1/vault/rules/{id}", { params: { id } });
  print(ctx, { deleted: id }, () => [`deleted rule ${id}`]);
}

// ---- hosts, default, starter pack ----

function hostLines(hosts: HostEntry[]): string[] {
  if (hosts.length === 0) return ["no host entries"];
  return table([
    ["PATTERN", "ACTION", "VIA", "LIMITS", "ID"],
    ...hosts.map((h) => [
      h.pattern,
      h.action + (h.implicit ? " (rule)" : ""),
      h.via ?? "-",
      limitsText(h),
      h.id,
    ]),
  ]);
}

export async function hostsList(ctx: Ctx): Promise<void> {
  const body = await api(ctx).call("get", "/v1/vault/hosts");
  print(ctx, body, () => hostLines(body.hosts));
}

export async function hostsSet(
  ctx: Ctx,
  action: "allow" | "block",
  patterns: string[],
  opts: { via?: string } & LimitFlags,
): Promise<void> {
  if (patterns.length === 0)
    throw new UsageError(`which hosts? benchwright vault hosts ${action} PATTERN...`);
  const via = oneOf(opts.via, VIA, "--via");
  if (via && action === "block") throw new UsageError("--via is for allowed hosts only");
  const limits = limitsBody(opts);
  const client = api(ctx);
  const entries: HostEntry[] = [];
  for (const pattern of patterns) {
    entries.push(
      await client.call("post", "/v1/vault/hosts", {
        body: { pattern, action, ...(via ? { via } : {}), ...limits },
      }),
    );
  }
  print(ctx, { hosts: entries }, () => entries.map(hostLine));
}

const hostLine = (e: HostEntry) =>
  `${e.action} ${e.pattern}${e.via ? ` via ${e.via}` : ""}${e.methods || e.paths ? ` limits ${limitsText(e)}` : ""}`;

/** Changes an allowed host's limits (flags not given stay as they are; "any" clears one). */
export async function hostsUpdate(ctx: Ctx, which: string, opts: LimitFlags): Promise<void> {
  const body = limitsBody(opts);
  if (Object.keys(body).length === 0) throw new UsageError("nothing to change: --methods, --paths");
  const client = api(ctx);
  const id = await hostId(client, which);
  const entry = await client.call("patch", "/v1/vault/hosts/{id}", { params: { id }, body });
  print(ctx, entry, () => [hostLine(entry)]);
}

/** A host entry's id: given, or the entry's whose pattern it is. */
async function hostId(client: Api, which: string): Promise<string> {
  if (which.startsWith("hst_")) return which;
  const { hosts } = await client.call("get", "/v1/vault/hosts");
  const entry = hosts.find((h) => h.pattern === which.toLowerCase());
  if (!entry) throw new ApiError(404, "not_found", `No host entry ${which}.`, null);
  return entry.id;
}

/** By id, or by pattern exactly as the entry has it. */
export async function hostsRemove(ctx: Ctx, which: string): Promise<void> {
  const client = api(ctx);
  const id = await hostId(client, which);
  await client.call("delete", "/v1/vault/hosts/{id}", { params: { id } });
  print(ctx, { deleted: id }, () => [`deleted host entry ${id}`]);
}

/**
 * Trust promotion: allow hosts a run was refused. Named hosts, or with --run every host that
 * run's boundary refused (all pages).
 */
export async function hostsPromote(ctx: Ctx, hosts: string[], opts: { run?: string }): Promise<void> {
  if (hosts.length > 0 && opts.run) throw new UsageError("give hosts or --run RUN_ID, not both");
  const client = api(ctx);
  const names = [...hosts];
  if (opts.run) {
    let cursor: string | undefined;
    do {
      const page = await client.call("get", "/v1/runs/{id}/blocked-hosts", {
        params: { id: opts.run },
        query: { limit: 100, cursor },
      });
      names.push(...page.blockedHosts.map((h) => h.host));
      cursor = page.nextCursor ?? undefined;
    } while (cursor);
    if (names.length === 0) {
      print(ctx, { entries: [], created: 0, updated: 0, unchanged: 0 }, () => [
        `run ${opts.run} was refused no hosts; nothing to allow`,
      ]);
      return;
    }
  }
  if (names.length === 0)
    throw new UsageError("which hosts? benchwright vault hosts promote HOST... | --run RUN_ID");
  const result = { entries: [] as HostEntry[], created: 0, updated: 0, unchanged: 0 };
  // The API takes at most 100 hosts a call.
  for (let i = 0; i < names.length; i += 100) {
    const part = await client.call("post", "/v1/vault/hosts/from-blocked", {
      body: { hosts: names.slice(i, i + 100) },
    });
    result.entries.push(...part.entries);
    result.created += part.created;
    result.updated += part.updated;
    result.unchanged += part.unchanged;
  }
  print(ctx, result, () => [
    ...result.entries.map((e) => `allow ${e.pattern}`),
    `${result.created} created, ${result.updated} switched from block, ${result.unchanged} already allowed`,
  ]);
}

export async function defaultAction(ctx: Ctx, action: string | undefined): Promise<void> {
  const client = api(ctx);
  const settings =
    action === undefined
      ? await client.call("get", "/v1/vault/settings")
      : await client.call("put", "/v1/vault/settings", {
          body: { default: oneOf(action, ACTIONS, "the default") as (typeof ACTIONS)[number] },
        });
  print(ctx, settings, () => [
    `default ${settings.default} (vault version ${settings.version})`,
    ...(settings.default === "block"
      ? [
          "hosts no entry names are refused; runs use catch-all routing (every connection goes through the proxy)",
        ]
      : []),
  ]);
}

export async function starterPack(ctx: Ctx): Promise<void> {
  const body = await api(ctx).call("post", "/v1/vault/hosts/starter-pack", { body: {} });
  print(ctx, body, () => [
    `allowed ${body.added.length} hosts${body.added.length > 0 ? `: ${body.added.join(", ")}` : ""}`,
    ...(body.kept.length > 0 ? [`kept your own entries for ${body.kept.join(", ")}`] : []),
  ]);
}

// ---- preview and dry run ----

export async function preview(ctx: Ctx, opts: { egress?: string; model?: string }): Promise<void> {
  const egress = oneOf(opts.egress, ["direct", "local"] as const, "--egress");
  const doc = await api(ctx).call("get", "/v1/vault/policy-preview", {
    query: { egress, model: opts.model },
  });
  print(ctx, doc, () => [
    `vault version ${doc.version}, default ${doc.default}, egress ${doc.egress ?? "direct"}`,
    `routing ${doc.routing.mode}${doc.routing.reasons.length > 0 ? ` (${doc.routing.reasons.join(", ")})` : ""}`,
    ...(doc.note ? [`note: ${doc.note}`] : []),
    "hosts",
    ...(doc.hosts.length === 0
      ? ["  (none)"]
      : doc.hosts.map(
          (h) =>
            `  ${h.action.padEnd(5)} ${h.pattern}${h.via ? ` via ${h.via}` : ""}${h.methods || h.paths ? ` limits ${limitsText({ methods: h.methods ?? null, paths: h.paths ?? null })}` : ""}`,
        )),
    "rules (first match wins)",
    ...(doc.rules.length === 0
      ? ["  (none)"]
      : doc.rules.map(
          (r) =>
            `  ${r.index}. ${r.host} ← ${r.secret} (${r.inject.scheme}), placeholder ${r.placeholderEnv ?? "none"}${r.methods || r.paths ? `, limits ${limitsText({ methods: r.methods ?? null, paths: r.paths ?? null })}` : ""}`,
        )),
    ...(doc.model ? [`model ${doc.model.name}: ${doc.model.provider} ${doc.model.upstreamModel}`] : []),
    `hosts file: ${doc.hostsFile.length} entries`,
  ]);
}

/** Edits of the vault as it is now, replayed against the hosts a past run reached or was refused. */
export async function dryRun(
  ctx: Ctx,
  runId: string,
  opts: { allow: string[]; block: string[]; remove: string[]; default?: string; all: boolean },
): Promise<void> {
  const def = oneOf(opts.default, ACTIONS, "--default");
  const upsert = [
    ...opts.allow.map((pattern) => ({ pattern, action: "allow" as const })),
    ...opts.block.map((pattern) => ({ pattern, action: "block" as const })),
  ];
  const body = await api(ctx).call("post", "/v1/vault/dry-run", {
    body: {
      runId,
      changes: {
        ...(def ? { default: def } : {}),
        hosts: { upsert, remove: opts.remove },
      },
    },
  });
  const rows = opts.all ? body.hosts : body.hosts.filter((h) => h.changed);
  const routing = body.routing;
  print(ctx, body, () => [
    `${body.counts.changed} of ${body.counts.hosts} hosts of run ${body.runId} would change${body.truncated ? " (list truncated)" : ""}`,
    `routing now ${routing.current.mode}, with the edits ${routing.draft.mode}`,
    ...(rows.length === 0
      ? []
      : table([
          ["HOST", "NOW", "WITH EDITS"],
          ...rows.map((h) => [
            h.host,
            `${h.current.action}${h.current.action === "allow" ? ` ${h.current.route}` : ""}`,
            `${h.draft.action}${h.draft.action === "allow" ? ` ${h.draft.route}` : ""}${h.changed ? "  *" : ""}`,
          ]),
        ])),
    ...(rows.length === 0 && body.counts.hosts > 0 && !opts.all ? ["(--all lists every host)"] : []),
  ]);
}
