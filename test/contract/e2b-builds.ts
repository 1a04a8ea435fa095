import { createHash, createHmac, randomBytes, randomUUID, timingSafeEqual } from "node:crypto";
import { gunzipSync } from "node:zlib";
import type { components } from "e2b";
import type { ContractLayerFiles, ContractTemplateBuild, E2bBuildFault } from "./e2b-contract";

// CONTRACT SERVER, not E2B: the template build API (E2B's V2 builder) as the `e2b` SDK's
// Template API (2.51.0, `Template.build`) calls it, for e2b-server.ts. Written from E2B's OpenAPI
// spec as generated into that SDK (`paths`/`components`: TemplateBuildRequestV3,
// TemplateBuildFileUpload, TemplateBuildStartV2, TemplateStep, TemplateBuildInfo), E2B's template
// docs (e2b.dev/docs/template/*: build, caching, how-it-works, migration-v2) and, for the
// messages and limits, E2B's open-source API and builder (e2b-dev/infra: the handlers
// template_request_build_v3, template_layer_files_upload, template_start_build_v2,
// template_build_status; the builder's step commands):
//   POST /v3/templates                             202 {templateID, buildID, names, tags, …}
//   GET  /templates/{templateID}/files/{hash}      201 {present} | {present: false, url}
//   PUT  <url> (the pre-signed upload, no API key) 200; the layer's tar(.gz) of a COPY's files
//   POST /v2/templates/{templateID}/builds/{id}    202; the steps (only a waiting build)
//   GET  /templates/{templateID}/builds/{id}/status?logsOffset=&limit=   TemplateBuildInfo
//   DELETE /templates/{templateID}                 204 (a name or an id) | 404; its builds go too
// Model: the upload URL is this server's own (loopback), signed with a key of its own; a
// chunked upload is refused 501 as S3 refuses it (the SDK sends a Content-Length). Uploaded
// files are the team's cache, keyed by the files hash: a second build of the same files is told
// `present: true`. A started build moves one phase per status poll (base, each step, finalize),
// so there are no timers: each phase logs `[builder i/n] TYPE args`, as E2B's builder does. A COPY
// step's archive must have been uploaded, and the server recomputes the SDK's files hash from
// it (a contract check E2B does not make: the bytes that arrived are the bytes hashed). Step
// types are E2B's builder's (ADD/COPY, RUN, USER, WORKDIR, ENV/ARG); a RUN fails only by fault.
// The templates given at start exist already built, so sandboxes can be created from them.

type Schemas = components["schemas"];

export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

export const id20 = () => {
  const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
  return [...randomBytes(20)].map((b) => alphabet[b % alphabet.length]).join("");
};

const IDENTIFIER = /^[a-z0-9_-]+$/;
const TAG = /^[a-z0-9_.-]+$/;
const HASH = /^[0-9a-f]{64}$/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** E2B's template defaults and bounds (infra: constants/templates.go), and this team's limits. */
const CPU = { default: 2, min: 1, max: 32, team: 8 };
const MEMORY = { default: 1024, min: 128, team: 8192 };
const STEP_TYPES = new Set(["ADD", "COPY", "RUN", "USER", "WORKDIR", "ENV", "ARG"]);
const REQUEST_KEYS = new Set(["alias", "cpuCount", "memoryMB", "minFreeDiskMb", "name", "tags", "teamID"]);
const START_KEYS = new Set([
  "force",
  "fromImage",
  "fromImageRegistry",
  "fromTemplate",
  "readyCmd",
  "startCmd",
  "steps",
]);
const STEP_KEYS = new Set(["args", "filesHash", "force", "type"]);
const LOG_PAGE = 100;
const UPLOAD_TTL_MS = 10 * 60_000;

interface Build extends ContractTemplateBuild {
  logs: Schemas["BuildLogEntry"][];
  /** Phases done: 0 = none, 1 = base, 1 + n = every step, 2 + n = finalized. */
  done: number;
}

type Step = NonNullable<ContractTemplateBuild["start"]>["steps"][number];

interface Layer {
  record: ContractLayerFiles;
  contents: Buffer[];
  links: string[];
}

interface TarEntry {
  path: string;
  type: "file" | "directory" | "symlink";
  mode: number;
  content: Buffer;
  link: string;
}

/** The entries of a layer archive (ustar, as node-tar writes it, gzipped or not). */
function readTar(raw: Buffer): TarEntry[] {
  const tar = raw[0] === 0x1f && raw[1] === 0x8b ? gunzipSync(raw) : raw;
  const entries: TarEntry[] = [];
  let pax: string | null = null;
  for (let off = 0; off + 512 <= tar.length; ) {
    const head = tar.subarray(off, off + 512);
    if (head.every((b) => b === 0)) break;
    const field = (a: number, b: number) =>
      head
        .subarray(a, b)
        .toString("utf8")
        .replace(/\0[\s\S]*$/, "");
    const size = Number.parseInt(field(124, 136).trim() || "0", 8);
    const type = field(156, 157) || "0";
    const content = tar.subarray(off + 512, off + 512 + size);
    off += 512 + Math.ceil(size / 512) * 512;
    if (type === "x") {
      pax = /\d+ path=([^\n]*)\n/.exec(content.toString())?.[1] ?? null;
      continue;
    }
    if (type === "g") continue;
    const kind = type === "0" ? "file" : type === "5" ? "directory" : type === "2" ? "symlink" : null;
    if (!kind) throw new HttpError(400, `archive entry type ${type} is outside the contract model`);
    const prefix = field(345, 500);
    const path = pax ?? (prefix ? `${prefix}/${field(0, 100)}` : field(0, 100));
    pax = null;
    const mode = Number.parseInt(field(100, 108).trim() || "0", 8);
    entries.push({ path, type: kind, mode, content: Buffer.from(content), link: field(157, 257) });
  }
  return entries;
}

/**
 * The SDK's files hash of a COPY (calculateFilesHash): "COPY src dest", then per file its
 * relative path, st_mode, size and content (a symlink: its lstat and target). A directory's
 * st_size is not in a tar, so an archive with one cannot be rehashed (null).
 */
function filesHash(src: string, dest: string, layer: Layer): string | null {
  const hash = createHash("sha256").update(`COPY ${src} ${dest}`);
  for (const [i, e] of layer.record.entries.entries()) {
    if (e.type === "directory") return null;
    hash.update(e.path);
    if (e.type === "symlink") {
      const link = layer.links[i] as string;
      hash
        .update(String(0o120000 | e.mode))
        .update(String(Buffer.byteLength(link)))
        .update(link);
    } else {
      hash
        .update(String(0o100000 | e.mode))
        .update(String(e.size))
        .update(layer.contents[i] as Buffer);
    }
  }
  return hash.digest("hex");
}

function only(body: unknown, keys: Set<string>, what: string): Record<string, unknown> {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw new HttpError(400, `Invalid request body: ${what} must be an object`);
  }
  for (const k of Object.keys(body)) {
    if (!keys.has(k)) throw new HttpError(400, `Invalid request body: unknown ${what} field ${k}`);
  }
  return body as Record<string, unknown>;
}

function checkResources(body: Record<string, unknown>): { cpuCount: number; memoryMB: number } {
  const cpu = body.cpuCount ?? CPU.default;
  const memory = body.memoryMB ?? MEMORY.default;
  if (!Number.isInteger(cpu) || !Number.isInteger(memory)) {
    throw new HttpError(400, "Invalid request body: cpuCount and memoryMB are integers");
  }
  const [c, m] = [cpu as number, memory as number];
  if (c < CPU.min) throw new HttpError(400, `CPU count must be at least ${CPU.min}`);
  if (c > CPU.max) throw new HttpError(400, `CPU count must be at most ${CPU.max}`);
  if (c !== 1 && c % 2 !== 0) throw new HttpError(400, "CPU count must be 1 or an even number");
  const support = "(if you need to increase this limit, please contact support)";
  if (c > CPU.team) throw new HttpError(400, `CPU count can't be higher than ${CPU.team} ${support}`);
  if (m < MEMORY.min) throw new HttpError(400, `Memory must be at least ${MEMORY.min} MiB`);
  if (m % 2 !== 0) throw new HttpError(400, "Memory must be divisible by 2");
  if (m > MEMORY.team) throw new HttpError(400, `Memory can't be higher than ${MEMORY.team} MiB ${support}`);
  return { cpuCount: c, memoryMB: m };
}

/** "name" or "name:tag", as E2B parses it (no namespaces here). */
function parseName(input: string): { name: string; tag: string | null } {
  const [name = "", tag, ...rest] = input.trim().toLowerCase().split(":");
  if (rest.length > 0 || !IDENTIFIER.test(name))
    throw new HttpError(400, `Invalid name: invalid name: ${input}`);
  if (tag !== undefined && !TAG.test(tag)) throw new HttpError(400, `Invalid name: invalid tag: ${tag}`);
  return { name, tag: tag === undefined || tag === "default" ? null : tag };
}

export function templateBuilds(options: {
  /** Templates that exist, built, from the start: a name (E2B's default size) or a name and size. */
  seeded: Array<string | { name: string; cpuCount: number; memoryMB: number }>;
  origin: () => string;
}) {
  /** By name: the template's id and its builds, newest last. */
  const templates = new Map<string, { templateID: string; builds: Build[] }>();
  const layers = new Map<string, Layer>();
  const faults = new Map<string, E2bBuildFault>();
  const signingKey = randomBytes(32);

  const newBuild = (
    templateID: string,
    name: string,
    tags: string[],
    size: { cpuCount: number; memoryMB: number },
  ): Build => ({
    templateID,
    buildID: randomUUID(),
    name,
    tags,
    ...size,
    status: "waiting",
    start: null,
    reason: null,
    logs: [],
    done: 0,
  });
  for (const seed of options.seeded) {
    const { name, ...size } =
      typeof seed === "string" ? { name: seed, cpuCount: CPU.default, memoryMB: MEMORY.default } : seed;
    const templateID = id20();
    const build = newBuild(templateID, name, ["default"], size);
    build.status = "ready";
    templates.set(name, { templateID, builds: [build] });
  }

  const byId = (templateID: string) => [...templates.entries()].find(([, t]) => t.templateID === templateID);
  const buildOf = (templateID: string, buildID: string) =>
    byId(templateID)?.[1].builds.find((b) => b.buildID === buildID);
  const sign = (hash: string, templateID: string, expires: string) =>
    createHmac("sha256", signingKey).update(`${hash}\n${templateID}\n${expires}`).digest("hex");

  function log(build: Build, step: string, message: string, level: Schemas["LogLevel"] = "info"): void {
    build.logs.push({ timestamp: new Date().toISOString(), level, message, step });
  }

  function failBuild(build: Build, step: string, message: string): void {
    log(build, step, message, "error");
    build.status = "error";
    build.reason = { message, step };
  }

  /** Runs the next phase of a started build. */
  function advance(build: Build): void {
    const start = build.start as NonNullable<Build["start"]>;
    const steps = start.steps;
    const phase = build.done++;
    if (phase === 0) {
      log(build, "base", `[base] FROM ${start.fromImage ?? `template ${start.fromTemplate}`}`);
      return;
    }
    if (phase > steps.length) {
      log(build, "finalize", "[finalize] provisioning, snapshotting the sandbox");
      log(build, "finalize", "Build finished");
      build.status = "ready";
      return;
    }
    const s = steps[phase - 1] as Step;
    log(
      build,
      String(phase),
      `[builder ${phase}/${steps.length}] ${s.type.toUpperCase()} ${(s.args ?? []).join(" ")}`,
    );
    const failure = runStep(build, s);
    if (failure) failBuild(build, String(phase), failure);
  }

  /** What E2B's builder would say about a step that fails; null when it succeeds. */
  function runStep(build: Build, s: Step): string | null {
    const type = s.type.toUpperCase();
    const [first, second] = s.args ?? [];
    if (!STEP_TYPES.has(type)) return `command type ${type} is not implemented`;
    if (type === "COPY" || type === "ADD") {
      if (first === undefined || second === undefined) {
        return `${type} requires a local path and a container path argument`;
      }
      if (!s.filesHash) return `${type} requires files hash to be set`;
      const layer = layers.get(s.filesHash);
      if (!layer) return "failed to open files object from storage: object not found";
      const again = filesHash(first, second, layer);
      layer.record.copy = {
        src: first,
        dest: second,
        verified: again === null ? null : again === s.filesHash,
      };
      if (again !== null && again !== s.filesHash) {
        return `the uploaded files do not hash to ${s.filesHash} (contract check)`;
      }
    }
    if (type === "RUN") {
      if (first === undefined) return "RUN requires command argument";
      const fault = faults.get(build.name);
      if (fault && first.includes(fault.runContaining)) {
        return `failed to run command '${first}': exit status ${fault.exitCode ?? 100}`;
      }
    }
    if ((type === "ENV" || type === "ARG") && (s.args ?? []).length % 2 !== 0) {
      return `${type} requires key-value pairs`;
    }
    return null;
  }

  function requestBuild(body: unknown): Schemas["TemplateRequestResponseV3"] {
    const b = only(body, REQUEST_KEYS, "request");
    const input = b.name ?? b.alias;
    if (typeof input !== "string") throw new HttpError(400, "Name is required");
    const { name, tag } = parseName(input);
    const extra = Array.isArray(b.tags) ? b.tags : [];
    const tags = [...new Set([...(tag ? [tag] : []), ...extra])];
    for (const t of tags)
      if (typeof t !== "string" || !TAG.test(t)) throw new HttpError(400, `Invalid tag: ${t}`);
    const size = checkResources(b);
    const template = templates.get(name) ?? { templateID: id20(), builds: [] };
    templates.set(name, template);
    const build = newBuild(template.templateID, name, tags.length > 0 ? tags : ["default"], size);
    template.builds.push(build);
    return {
      templateID: template.templateID,
      buildID: build.buildID,
      aliases: [name],
      names: [name],
      tags: build.tags,
      public: false,
    };
  }

  function startBuild(templateID: string, buildID: string, body: unknown): void {
    if (!UUID.test(buildID)) throw new HttpError(400, `Invalid build ID: ${buildID}`);
    const build = buildOf(templateID, buildID);
    if (!build) throw new HttpError(404, `Error when getting template: no build ${buildID} of ${templateID}`);
    const b = only(body, START_KEYS, "build");
    const from = [b.fromImage, b.fromTemplate].filter((x) => typeof x === "string" && x !== "");
    if (from.length !== 1)
      throw new HttpError(400, "Exactly one of fromImage or fromTemplate must be given and non-empty");
    const steps = (b.steps ?? []) as unknown[];
    if (!Array.isArray(steps)) throw new HttpError(400, "Invalid request body: steps must be a list");
    for (const step of steps) {
      const s = only(step, STEP_KEYS, "step");
      if (typeof s.type !== "string") throw new HttpError(400, "Invalid request body: a step needs a type");
      if (s.args !== undefined && !(Array.isArray(s.args) && s.args.every((a) => typeof a === "string"))) {
        throw new HttpError(400, "Invalid request body: step args must be strings");
      }
    }
    if (build.status !== "waiting") throw new HttpError(400, "build is not in waiting state");
    build.start = b as NonNullable<Build["start"]>;
    build.start.steps = steps as NonNullable<Build["start"]>["steps"];
    build.status = "building";
    log(build, "base", `Building template ${templateID}/${buildID}`);
  }

  function status(templateID: string, buildID: string, query: URLSearchParams): Schemas["TemplateBuildInfo"] {
    if (!UUID.test(buildID)) throw new HttpError(400, "Invalid build id");
    const build = buildOf(templateID, buildID);
    if (!build) throw new HttpError(400, `Build '${buildID}' not found`);
    const info = { templateID, buildID, logs: [] as string[] };
    if (build.status === "waiting") return { ...info, status: "waiting", logEntries: [] };
    if (build.status === "building") advance(build);
    const offset = Math.max(0, Number(query.get("logsOffset") ?? 0) || 0);
    const limit = Math.min(Number(query.get("limit") ?? LOG_PAGE) || LOG_PAGE, LOG_PAGE);
    const result: Schemas["TemplateBuildInfo"] = {
      ...info,
      status: build.status,
      logEntries: build.logs.slice(offset, offset + limit),
    };
    if (build.reason) {
      const step = build.reason.step;
      const logEntries = build.logs.filter(
        (l) => l.step === step && (l.level === "warn" || l.level === "error"),
      );
      result.reason = { ...build.reason, logEntries };
    }
    return result;
  }

  return {
    /** A template a sandbox may be created from (ready), by name[:tag] or id. */
    /** A template by name or id, with the size of its newest ready build (what a sandbox gets). */
    resolve(ref: string): { templateID: string; alias: string; cpuCount: number; memoryMB: number } | null {
      const name = ref.split(":")[0] ?? "";
      const found = templates.has(name) ? ([name, templates.get(name)] as const) : byId(ref);
      const ready = found?.[1]?.builds.filter((b) => b.status === "ready").at(-1);
      if (!found?.[1] || !ready) return null;
      return {
        templateID: found[1].templateID,
        alias: found[0],
        cpuCount: ready.cpuCount,
        memoryMB: ready.memoryMB,
      };
    },

    /** The template routes of the platform API (X-API-KEY already checked); null: not one. */
    handle(method: string, path: string, query: URLSearchParams, body: unknown): [number, unknown] | null {
      if (method === "POST" && path === "/v3/templates") return [202, requestBuild(body)];
      const files = /^\/templates\/([a-z0-9]+)\/files\/([^/]+)$/.exec(path);
      if (method === "GET" && files) {
        const [, templateID, hash] = files as unknown as [string, string, string];
        if (!HASH.test(hash)) throw new HttpError(400, "Invalid files hash");
        if (!byId(templateID))
          throw new HttpError(404, `Error when getting template: ${templateID} not found`);
        if (layers.has(hash)) return [201, { present: true } satisfies Schemas["TemplateBuildFileUpload"]];
        const expires = String(Date.now() + UPLOAD_TTL_MS);
        const q = new URLSearchParams({ templateID, expires, signature: sign(hash, templateID, expires) });
        const url = `${options.origin()}/_storage/${hash}?${q}`;
        return [201, { present: false, url } satisfies Schemas["TemplateBuildFileUpload"]];
      }
      const start = /^\/v2\/templates\/([a-z0-9]+)\/builds\/([^/]+)$/.exec(path);
      if (method === "POST" && start) {
        startBuild(start[1] as string, start[2] as string, body);
        return [202, null];
      }
      const st = /^\/templates\/([a-z0-9]+)\/builds\/([^/]+)\/status$/.exec(path);
      if (method === "GET" && st) return [200, status(st[1] as string, st[2] as string, query)];
      const one = /^\/templates\/([^/]+)$/.exec(path);
      if (method === "DELETE" && one) {
        const ref = decodeURIComponent(one[1] as string);
        const found = templates.has(ref) ? ref : byId(ref)?.[0];
        if (!found) throw new HttpError(404, `Template '${ref}' not found`);
        templates.delete(found);
        return [204, null];
      }
      return null;
    },

    /** PUT to an upload URL this server handed out: the signature, not an API key, admits it. */
    upload(
      method: string,
      path: string,
      query: URLSearchParams,
      headers: Record<string, string>,
      raw: Buffer,
    ): number {
      const hash = /^\/_storage\/([0-9a-f]{64})$/.exec(path)?.[1];
      if (method !== "PUT" || !hash) throw new HttpError(405, "uploads are PUT to the URL given");
      const templateID = query.get("templateID") ?? "";
      const expires = query.get("expires") ?? "";
      const given = Buffer.from(query.get("signature") ?? "");
      const wanted = Buffer.from(sign(hash, templateID, expires));
      if (given.length !== wanted.length || !timingSafeEqual(given, wanted))
        throw new HttpError(403, "SignatureDoesNotMatch");
      if (Number(expires) < Date.now()) throw new HttpError(403, "Request has expired");
      if (headers["content-length"] === undefined)
        throw new HttpError(501, "NotImplemented: chunked uploads");
      if (Number(headers["content-length"]) !== raw.length) throw new HttpError(400, "IncompleteBody");
      const entries = readTar(raw);
      layers.set(hash, {
        record: {
          hash,
          entries: entries.map((e) => ({
            path: e.path,
            type: e.type,
            mode: e.mode,
            size: e.content.length,
            sha256: createHash("sha256").update(e.content).digest("hex"),
          })),
        },
        contents: entries.map((e) => e.content),
        links: entries.map((e) => e.link),
      });
      return 200;
    },

    builds: (): ContractTemplateBuild[] =>
      [...templates.values()].flatMap((t) => t.builds.map(({ logs: _l, done: _d, ...b }) => b)),
    layers: (): ContractLayerFiles[] => [...layers.values()].map((l) => l.record),
    fault(f: E2bBuildFault): void {
      faults.set(f.template, f);
    },
  };
}
