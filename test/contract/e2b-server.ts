import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestProject } from "vitest/node";
import { E2B_TEMPLATES } from "../../scripts/lib/e2b-templates";
import { HttpError, templateBuilds } from "./e2b-builds";
import type { E2bBuildFault, E2bContractInfo, E2bFaults, RecordedE2bRequest } from "./e2b-contract";
import { envdApi } from "./e2b-envd";
import { platformApi } from "./e2b-platform";
import { installRunner } from "./e2b-processes";
import { type E2bStore, killBox } from "./e2b-store";

// CONTRACT SERVER, not E2B: what the `e2b` SDK (2.51.0) calls, written from E2B's published
// OpenAPI spec as that SDK carries it (its generated `paths`/`components` types) and envd's
// process.proto, on loopback; re-checked against E2B's open-source API (e2b-dev/infra, Aug 2026)
// for the answers the spec leaves open. E2B's cloud cannot be reached from here; the real SDK
// talks to this instead, pointed at it with its documented `apiUrl` and `sandboxUrl` options.
//
// This file is the HTTP server: it records each request and hands it to its part, each with its
// routes and its model in its own file:
//   the platform API (X-API-KEY): sandboxes         e2b-platform.ts
//   the platform API: template builds, uploads      e2b-builds.ts
//   envd (E2b-Sandbox-Id): health, the files API    e2b-envd.ts
//   envd: the process API, the process model        e2b-processes.ts
//   what they share (sandboxes, processes, faults)  e2b-store.ts
// Every request is recorded (GET /_contract/requests); faults per run: POST /_contract/faults;
// template builds and uploaded layers: GET /_contract/templates; a failing build: POST
// /_contract/build-faults.

function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolveBody, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => resolveBody(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

export interface E2bServerOptions {
  apiKey: string;
  domain: string;
  templates: { proxy: string; work: string };
}

export async function startE2bServer(options: E2bServerOptions) {
  const work = mkdtempSync(join(tmpdir(), "bw-e2b-contract-"));
  const runner = await installRunner(work);
  const SIZES = new Map(E2B_TEMPLATES.map((t) => [t.key, { cpuCount: t.cpuCount, memoryMB: t.memoryMB }]));
  const recorded: RecordedE2bRequest[] = [];
  let origin = "";
  const store: E2bStore = {
    work,
    cgroupRoot: runner.cgroupRoot,
    boxes: new Map(),
    faults: new Map(),
    templates: templateBuilds({
      seeded: [
        { name: options.templates.proxy, ...(SIZES.get("proxy") as { cpuCount: number; memoryMB: number }) },
        { name: options.templates.work, ...(SIZES.get("work") as { cpuCount: number; memoryMB: number }) },
      ],
      origin: () => origin,
    }),
  };
  const { boxes, faults, templates } = store;
  const platform = platformApi(store);
  const envd = envdApi(store, runner);

  const server = createServer(async (req, res) => {
    const url = new URL(req.url ?? "/", "http://contract");
    const raw = await readBody(req);
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(req.headers)) {
      if (["x-api-key", "x-access-token", "e2b-traffic-access-token"].includes(k)) continue;
      headers[k] = Array.isArray(v) ? v.join(", ") : (v ?? "");
    }
    const envdSandbox = req.headers["e2b-sandbox-id"];
    const api: RecordedE2bRequest["api"] = url.pathname.startsWith("/_contract/")
      ? "contract"
      : url.pathname.startsWith("/_storage/")
        ? "storage"
        : typeof envdSandbox === "string"
          ? "envd"
          : "platform";
    const streaming = (req.headers["content-type"] ?? "").startsWith("application/connect+json");
    let body: unknown = null;
    if (api === "storage" || (api === "envd" && url.pathname === "/files")) body = { bytes: raw.length };
    else
      try {
        const text =
          streaming && raw.length >= 5 ? raw.subarray(5, 5 + raw.readUInt32BE(1)).toString() : raw.toString();
        body = text ? JSON.parse(text) : null;
      } catch {
        body = raw.toString();
      }
    const basic = /^Basic (.+)$/.exec(req.headers.authorization ?? "")?.[1];
    const user = basic ? Buffer.from(basic, "base64").toString().replace(/:$/, "") : null;
    const record: RecordedE2bRequest = {
      seq: recorded.length + 1,
      api,
      method: req.method ?? "",
      path: url.pathname,
      query: Object.fromEntries(url.searchParams),
      sandboxId:
        typeof envdSandbox === "string"
          ? envdSandbox
          : (/\/sandboxes\/([a-z0-9]+)/.exec(url.pathname)?.[1] ?? null),
      user,
      apiKey:
        req.headers["x-api-key"] === undefined
          ? "absent"
          : req.headers["x-api-key"] === options.apiKey
            ? "ok"
            : "wrong",
      accessToken: "absent",
      headers,
      body,
      status: 0,
      deployment: null,
    };
    const json = (status: number, value: unknown, extra: Record<string, string> = {}) => {
      record.status = status;
      // An empty answer says so (as E2B's does): the SDK reads any other body as JSON.
      if (value === null)
        res.writeHead(status, status === 204 ? extra : { "content-length": "0", ...extra }).end();
      else res.writeHead(status, { "content-type": "application/json", ...extra }).end(JSON.stringify(value));
    };
    // Whose request it was (the deployment's metadata), so that test files running at once can
    // each look at their own: a created sandbox's, the sandbox's it is about, a list's filter.
    const meta =
      record.sandboxId !== null
        ? boxes.get(record.sandboxId)?.metadata
        : record.path === "/v2/sandboxes" && record.method === "POST"
          ? ((body as { metadata?: Record<string, string> } | null)?.metadata ?? undefined)
          : record.path === "/v2/sandboxes"
            ? Object.fromEntries(
                [...new URLSearchParams(url.searchParams.get("metadata") ?? "")].map(([k, v]) => [
                  decodeURIComponent(k),
                  decodeURIComponent(v),
                ]),
              )
            : undefined;
    record.deployment = meta?.["bw-deployment"] ?? null;
    if (api !== "contract") recorded.push(record);
    try {
      if (api === "contract") return contract(req.method ?? "", url, body, json);
      if (api === "storage") {
        return json(templates.upload(req.method ?? "", url.pathname, url.searchParams, headers, raw), null);
      }
      if (api === "platform") {
        if (record.apiKey !== "ok") throw new HttpError(401, "Invalid API key");
        const [status, value, extra] = platform(req.method ?? "", url.pathname, url.searchParams, body);
        return json(status, value, extra);
      }
      return envd({ req, res, url, raw, body, user, streaming, record, json });
    } catch (e) {
      if (e instanceof HttpError) return json(e.status, { code: e.status, message: e.message });
      return json(500, { code: 500, message: (e as Error).message });
    }
  });

  function contract(
    method: string,
    url: URL,
    body: unknown,
    json: (status: number, value: unknown) => void,
  ): void {
    if (method === "GET" && url.pathname === "/_contract/requests") {
      const since = Number(url.searchParams.get("since") ?? 0);
      json(
        200,
        recorded.filter((r) => r.seq > since),
      );
      return;
    }
    if (method === "GET" && url.pathname === "/_contract/sandboxes") {
      json(
        200,
        [...boxes.values()].map(
          ({
            envdAccessToken: _e,
            trafficAccessToken: _t,
            dir,
            procs: _p,
            size: _z,
            cgroup: _c,
            startedAt: _s,
            endAt: _n,
            ...s
          }) => ({ ...s, home: dir }),
        ),
      );
      return;
    }
    if (method === "GET" && url.pathname === "/_contract/templates") {
      json(200, { builds: templates.builds(), layers: templates.layers() });
      return;
    }
    if (method === "POST" && url.pathname === "/_contract/build-faults") {
      templates.fault(body as E2bBuildFault);
      json(204, null);
      return;
    }
    if (method === "POST" && url.pathname === "/_contract/faults") {
      const f = body as E2bFaults;
      faults.set(f.runId, f);
      json(204, null);
      return;
    }
    json(404, { code: 404, message: "no such contract route" });
  }

  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const info: E2bContractInfo = {
    url: origin,
    apiKey: options.apiKey,
    domain: options.domain,
    templates: options.templates,
    cgroups: store.cgroupRoot !== null,
  };
  /** Kills every sandbox's processes and removes the state; synchronous, so it can run at exit. */
  const killAll = () => {
    for (const box of [...boxes.values()]) killBox(store, box);
    rmSync(work, { recursive: true, force: true });
  };
  return {
    info,
    killAll,
    async close() {
      killAll();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/**
 * The E2B contract server for the worker tests, provided to them as `e2b`. It closes with vitest,
 * killing every process a sandbox still runs (the runner's commands are detached: they would
 * outlive it), and kills them at exit too if vitest ends without closing.
 */
export async function startE2bContract(project: TestProject): Promise<void> {
  const server = await startE2bServer({
    apiKey: `e2b_${randomBytes(20).toString("hex")}`,
    domain: "e2b.contract.test",
    templates: { proxy: "benchwright-proxy", work: "benchwright-work" },
  });
  process.once("exit", server.killAll);
  project.vitest.onClose(() => server.close());
  project.provide("e2b", server.info);
}
