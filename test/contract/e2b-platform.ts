import { randomBytes } from "node:crypto";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import type { components } from "e2b";
import { HttpError, id20 } from "./e2b-builds";
import { type Box, type E2bStore, faultsOf, killBox, signalSandbox } from "./e2b-store";

// The E2B contract server's platform API for sandboxes (e2b-server.ts routes to it; the template
// build API is e2b-builds.ts), from the OpenAPI spec `e2b` SDK 2.51.0 carries. Apart from envd:
// it is E2B's control plane, keyed by the API key, not by a sandbox's access token.
//
// Platform API (X-API-KEY, JSON, errors as {code, message}):
//   POST   /v2/sandboxes                       NewSandboxV2 → 201 Sandbox; templateID names a
//                                              built template (name[:tag] or id; else 404
//                                              "template '…' not found"), answered as E2B does:
//                                              templateID = the template's id, alias = its name
//   GET    /v2/sandboxes?metadata=&state=&limit=&nextToken=   ListedSandbox[] (+ X-Next-Token)
//   GET    /sandboxes/{id}                     SandboxDetail
//   DELETE /sandboxes/{id}                     204 | 404
//   POST   /sandboxes/{id}/pause               204 | 409 already paused | 404
//   POST   /v2/sandboxes/{id}/connect          200 running | 201 resumed (TTL only extended)
//   POST   /sandboxes/{id}/timeout             204
//   PUT    /sandboxes/{id}/network             204 (replaces the egress configuration; 409 paused)
//   the template build API (V2 builder) of `Template.build`: see e2b-builds.ts
// A paused sandbox's processes are stopped (SIGSTOP) and continued on resume. Timeouts are
// recorded, never enforced (no sandbox expires).

type Schemas = components["schemas"];

const ENVD_VERSION = "0.5.8";
const PAGE_MAX = 100;

const NEW_SANDBOX_KEYS = new Set([
  "allow_internet_access",
  "autoPause",
  "autoPauseMemory",
  "autoResume",
  "envVars",
  "iam",
  "mcp",
  "metadata",
  "network",
  "templateID",
  "timeout",
  "volumeMounts",
]);
const NETWORK_KEYS = new Set([
  "allowOut",
  "allowPublicTraffic",
  "denyOut",
  "egressProxy",
  "httpsPorts",
  "maskRequestHost",
  "rules",
]);
const NETWORK_UPDATE_KEYS = new Set(["allow_internet_access", "allowOut", "denyOut", "egressProxy", "rules"]);
const CIDR = /^(?:[0-9]{1,3}\.){3}[0-9]{1,3}(?:\/[0-9]{1,2})?$/;

// The answers are typed by the SDK's own OpenAPI-generated schemas: tsc holds them to the spec.
function sandboxJson(box: Box): Schemas["Sandbox"] {
  return {
    clientID: "contract",
    envdVersion: ENVD_VERSION,
    sandboxID: box.sandboxID,
    templateID: box.templateID,
    alias: box.alias,
    domain: null,
    envdAccessToken: box.envdAccessToken,
    trafficAccessToken: box.trafficAccessToken,
  };
}

function listedJson(box: Box): Schemas["ListedSandbox"] {
  return {
    clientID: "contract",
    cpuCount: box.size.cpuCount,
    diskSizeMB: 1024,
    endAt: box.endAt.toISOString(),
    envdVersion: ENVD_VERSION,
    memoryMB: box.size.memoryMB,
    metadata: box.metadata,
    sandboxID: box.sandboxID,
    startedAt: box.startedAt.toISOString(),
    state: box.state,
    templateID: box.templateID,
    alias: box.alias,
  };
}

function checkNetwork(network: unknown, keys: Set<string>): Record<string, unknown> {
  if (typeof network !== "object" || network === null || Array.isArray(network)) {
    throw new HttpError(400, "network must be an object");
  }
  for (const k of Object.keys(network))
    if (!keys.has(k)) throw new HttpError(400, `unknown network field ${k}`);
  const n = network as Record<string, unknown>;
  for (const list of ["allowOut", "denyOut"]) {
    if (
      n[list] !== undefined &&
      (!Array.isArray(n[list]) || !(n[list] as unknown[]).every((x) => typeof x === "string"))
    ) {
      throw new HttpError(400, `${list} must be a list of strings`);
    }
  }
  for (const d of (n.denyOut as string[] | undefined) ?? []) {
    if (!CIDR.test(d)) throw new HttpError(400, `denyOut takes CIDR blocks or IP addresses, not ${d}`);
  }
  return n;
}

/** The platform API's answers: [status, body, headers]; throws HttpError for an error answer. */
export function platformApi(
  store: E2bStore,
): (
  method: string,
  path: string,
  query: URLSearchParams,
  body: unknown,
) => [number, unknown, Record<string, string>?] {
  function createSandbox(body: Record<string, unknown>): Box {
    for (const k of Object.keys(body))
      if (!NEW_SANDBOX_KEYS.has(k)) throw new HttpError(400, `unknown field ${k}`);
    if (typeof body.templateID !== "string") throw new HttpError(400, "templateID is required");
    const template = store.templates.resolve(body.templateID);
    if (!template) throw new HttpError(404, `template '${body.templateID}' not found`);
    const network = body.network === undefined ? null : checkNetwork(body.network, NETWORK_KEYS);
    const metadata = (body.metadata ?? {}) as Record<string, string>;
    const timeoutSeconds = typeof body.timeout === "number" ? body.timeout : 300;
    const id = id20();
    const dir = join(store.work, "sandboxes", id);
    mkdirSync(join(dir, "exec"), { recursive: true });
    const { cpuCount, memoryMB, ...named } = template;
    const box: Box = {
      sandboxID: id,
      ...named,
      size: { cpuCount, memoryMB },
      cgroup: store.cgroupRoot === null ? null : join(store.cgroupRoot, `bw-e2b-contract-${id}`),
      state: "running",
      metadata,
      envVars: (body.envVars ?? {}) as Record<string, string>,
      network,
      autoPause: body.autoPause === true,
      timeoutSeconds,
      pauses: 0,
      resumes: 0,
      envdAccessToken: `ea_${randomBytes(16).toString("hex")}`,
      trafficAccessToken:
        network?.allowPublicTraffic === false ? `ta_${randomBytes(16).toString("hex")}` : null,
      startedAt: new Date(),
      endAt: new Date(Date.now() + timeoutSeconds * 1000),
      dir,
      procs: new Map(),
    };
    if (faultsOf(store, box).dropNetworkOnCreate && box.network) {
      const { allowOut: _a, denyOut: _d, ...rest } = box.network;
      box.network = rest;
    }
    store.boxes.set(id, box);
    return box;
  }

  function mustBox(id: string): Box {
    const box = store.boxes.get(id);
    if (!box) throw new HttpError(404, `sandbox ${id} not found`);
    return box;
  }

  function platform(
    method: string,
    path: string,
    query: URLSearchParams,
    body: unknown,
  ): [number, unknown, Record<string, string>?] {
    const b = (body ?? {}) as Record<string, unknown>;
    const template = store.templates.handle(method, path, query, body);
    if (template) return [template[0], template[1]];
    if (method === "POST" && path === "/v2/sandboxes") return [201, sandboxJson(createSandbox(b))];
    if (method === "GET" && path === "/v2/sandboxes") {
      const wanted = new URLSearchParams(query.get("metadata") ?? "");
      const match: Array<[string, string]> = [...wanted].map(([k, v]) => [
        decodeURIComponent(k),
        decodeURIComponent(v),
      ]);
      const states = (query.get("state") ?? "").split(",").filter(Boolean);
      const all = [...store.boxes.values()]
        .filter((x) => match.every(([k, v]) => x.metadata[k] === v))
        .filter((x) => states.length === 0 || states.includes(x.state))
        .sort(
          (x, y) => y.startedAt.getTime() - x.startedAt.getTime() || (x.sandboxID < y.sandboxID ? -1 : 1),
        );
      const limit = Math.min(Number(query.get("limit") ?? PAGE_MAX) || PAGE_MAX, PAGE_MAX);
      const from = Number(query.get("nextToken") ?? 0) || 0;
      const page = all.slice(from, from + limit);
      const headers: Record<string, string> = {
        "x-total-running": String(all.filter((x) => x.state === "running").length),
      };
      if (from + limit < all.length) headers["x-next-token"] = String(from + limit);
      return [200, page.map(listedJson), headers];
    }
    const m = /^\/(v2\/)?sandboxes\/([a-z0-9]+)(\/[a-z]+)?$/.exec(path);
    if (!m) throw new HttpError(404, `no route ${method} ${path}`);
    const [, v2, id, tail = ""] = m as unknown as [string, string | undefined, string, string | undefined];
    const box = mustBox(id);
    const route = `${method} ${v2 ? "/v2" : ""}${tail}`;
    switch (route) {
      case "GET ": {
        const detail: Schemas["SandboxDetail"] = {
          ...listedJson(box),
          allowInternetAccess: null,
          domain: null,
          envdAccessToken: box.envdAccessToken,
          lifecycle: { autoResume: false, onTimeout: box.autoPause ? "pause" : "kill" },
          ...(box.network ? { network: box.network as Schemas["SandboxNetworkConfig"] } : {}),
        };
        return [200, detail];
      }
      case "DELETE ":
        killBox(store, box);
        return [204, null];
      case "POST /pause":
        if (box.state === "paused") throw new HttpError(409, `sandbox ${id} is already paused`);
        signalSandbox(box, "SIGSTOP");
        box.state = "paused";
        box.pauses++;
        return [204, null];
      case "POST /v2/connect": {
        const timeout = typeof b.timeout === "number" ? b.timeout : 300;
        const until = new Date(Date.now() + timeout * 1000);
        if (until > box.endAt) box.endAt = until; // TTL is only extended
        if (box.state === "running") return [200, sandboxJson(box)];
        box.state = "running";
        box.resumes++;
        signalSandbox(box, "SIGCONT");
        if (faultsOf(store, box).dropNetworkOnResume && box.network) {
          const { allowOut: _a, denyOut: _d, ...rest } = box.network;
          box.network = rest;
        }
        return [201, sandboxJson(box)];
      }
      case "POST /timeout":
        if (typeof b.timeout !== "number") throw new HttpError(400, "timeout is required");
        box.timeoutSeconds = b.timeout;
        box.endAt = new Date(Date.now() + b.timeout * 1000);
        return [204, null];
      case "PUT /network": {
        const update = checkNetwork(b, NETWORK_UPDATE_KEYS);
        if (box.state === "paused") throw new HttpError(409, `sandbox ${id} is paused`);
        if (faultsOf(store, box).ignoreNetworkUpdates) return [204, null];
        // The update replaces the egress configuration; what only create sets stays.
        const kept = Object.fromEntries(
          Object.entries(box.network ?? {}).filter(([k]) => !NETWORK_UPDATE_KEYS.has(k)),
        );
        const { allow_internet_access, ...egress } = update;
        box.network = {
          ...kept,
          ...egress,
          ...(allow_internet_access === false ? { denyOut: ["0.0.0.0/0"] } : {}),
        };
        return [204, null];
      }
      default:
        throw new HttpError(404, `no route ${method} ${path}`);
    }
  }

  return platform;
}
