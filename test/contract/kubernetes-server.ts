import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { build } from "esbuild";
import type { TestProject } from "vitest/node";
import { recordedExecs } from "../../proxy-image/src/exec-runner/exec-runner";
import { type WebSocket, WebSocketServer } from "../../scripts/lib/node-ws";
import type { ContractOptions, KubernetesContractInfo, RecordedRequest } from "./kubernetes-contract";

// A CONTRACT SERVER for the Kubernetes API (this machine cannot reach a DigitalOcean Kubernetes
// cluster): exactly the core/v1 and networking.k8s.io/v1 endpoints the sandbox0 backend uses,
// with the request and response shapes of the Kubernetes API reference: objects with
// kind/apiVersion/metadata, lists with items, errors as metav1.Status (reason AlreadyExists 409,
// NotFound 404, Invalid 422, Forbidden 403, Unauthorized 401 for a missing or wrong bearer token),
// pods/exec over WebSocket with the channel protocol (v5.channel.k8s.io, v4.channel.k8s.io:
// byte 0 of each binary message is the stream, 0 stdin, 1 stdout, 2 stderr, 3 the Status; v5's
// CLOSE signal is stream 255), pods/log as text, pods/resize as a strategic merge patch.
// Loopback only. Every API request is recorded for the tests (GET /_contract/requests).
//
// What is modelled rather than real, and how:
// - Scheduling: a pod is Pending in the create answer; the next read of it (GET, list, exec,
//   log) finds it Running with its init containers Completed, a pod IP from 10.244.0.0/16, and
//   every container running (options: stay Pending for n reads; an init container that fails).
//   A deleted pod is Terminating (deletionTimestamp) for one more GET, then gone.
// - Containers: a work pod's `/bw/tools/bin/bw-exec ...` exec RUNS THE REAL EXEC RUNNER
//   (proxy-image/src/exec-runner/main.ts, bundled at start) with node on this machine against a
//   per-pod temporary directory as its BW_EXEC_DIR, so commands really run (on this machine, as
//   the test user: tests run only commands they chose); so do `/bw/tools/bin/bw-unpack` and
//   `bw-collect` (the real programs, binary stdin closed by v5's CLOSE, binary stdout), with
//   paths of this machine. Each container has its own runner state (a setup container's commands
//   run, like the work container's, as the test user: the model has no root). Deleting the pod
//   SIGKILLs the process groups it started. A work pod's `/etc/hosts` is a file of its own,
//   written as the kubelet writes it (hostAliases at the end; GET/PUT /_contract/hosts reads and
//   replaces it, as a setup stage's root could). The sealer (`bw-seal`) is modelled: `bw-init
//   seal <id>` SIGKILLs the setup container's process groups (the runtime kills its whole cgroup;
//   the real script's cgroup scan is tested on a real kernel in test/local/bw-init-seal.test.ts)
//   and ends that container; `bw-init hosts` runs the real `bw-wiring reinstall` on the pod's
//   hosts file. A proxy pod runs nothing: its log is a scripted line, it "exits" when a
//   test says so (POST /_contract/terminate), and `bw-proxy-view` prints a scripted JSON line.
// - Namespaces exist when named. PodSecurity admission (baseline) is checked on capabilities only.

const API = "/api/v1/namespaces/";
const NETWORKING = "/apis/networking.k8s.io/v1/namespaces/";
const RUNNER_COMMAND = "/bw/tools/bin/bw-exec";
/** PodSecurity baseline: the capabilities a container may add. */
const BASELINE_CAPS = new Set([
  "AUDIT_WRITE",
  "CHOWN",
  "DAC_OVERRIDE",
  "FOWNER",
  "FSETID",
  "KILL",
  "MKNOD",
  "NET_BIND_SERVICE",
  "SETFCAP",
  "SETGID",
  "SETPCAP",
  "SETUID",
  "SYS_CHROOT",
]);
const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const DNS1035_LABEL = /^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const LABEL_VALUE = /^([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$/;
const LABEL_KEY =
  /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$/;

type Json = Record<string, unknown>;
type Resource = "pods" | "services" | "secrets" | "networkpolicies";

const KIND: Record<Resource, { kind: string; apiVersion: string; list: string }> = {
  pods: { kind: "Pod", apiVersion: "v1", list: "PodList" },
  services: { kind: "Service", apiVersion: "v1", list: "ServiceList" },
  secrets: { kind: "Secret", apiVersion: "v1", list: "SecretList" },
  networkpolicies: { kind: "NetworkPolicy", apiVersion: "networking.k8s.io/v1", list: "NetworkPolicyList" },
};

interface PodRecord {
  obj: Json;
  pendingReads: number;
  terminatingReads: number | null;
  dir: string;
  log: string;
}

/** Each container's runner state: `work`'s as before, any other container's beside it. */
const execDirOf = (rec: PodRecord, container: string) =>
  join(rec.dir, container === "work" ? "exec" : `exec-${container}`);
const hostsFileOf = (rec: PodRecord) => join(rec.dir, "etc-hosts");

/** The kubelet's /etc/hosts of a pod (pkg/kubelet/kubelet_pods.go, managedHostsFileContent). */
function kubeletHosts(podIP: string, podName: string, aliases: Json[]): string {
  let text =
    "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
    `fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n${podIP}\t${podName}\n`;
  if (aliases.length > 0) {
    text += "\n# Entries added by HostAliases.\n";
    for (const a of aliases) text += `${String(a.ip)}\t${((a.hostnames ?? []) as string[]).join("\t")}\n`;
  }
  return text;
}

interface Namespace {
  objects: Record<Exclude<Resource, "pods">, Map<string, Json>>;
  pods: Map<string, PodRecord>;
  options: ContractOptions;
}

function status(code: number, reason: string, message: string, details?: Json): Json {
  return {
    kind: "Status",
    apiVersion: "v1",
    metadata: {},
    status: "Failure",
    message,
    reason,
    details,
    code,
  };
}

const success = (kind: string, name: string): Json => ({
  kind: "Status",
  apiVersion: "v1",
  metadata: {},
  status: "Success",
  details: { name, kind },
});

class Refusal extends Error {
  constructor(
    readonly code: number,
    readonly body: Json,
  ) {
    super(String(body.message));
  }
}

const invalid = (kind: string, name: string, why: string) =>
  new Refusal(422, status(422, "Invalid", `${kind} "${name}" is invalid: ${why}`, { name, kind }));
const badRequest = (why: string) => new Refusal(400, status(400, "BadRequest", why));
const notFound = (resource: string, name: string) =>
  new Refusal(404, status(404, "NotFound", `${resource} "${name}" not found`, { name, kind: resource }));

function matches(labels: Record<string, string>, selector: string | null): boolean {
  if (!selector) return true;
  return selector.split(",").every((term) => {
    const t = term.trim();
    const ne = t.indexOf("!=");
    if (ne !== -1) return labels[t.slice(0, ne)] !== t.slice(ne + 2);
    const eq = t.indexOf("=");
    if (eq === -1) return t in labels;
    const key = t.slice(0, eq);
    const value = t.slice(t[eq + 1] === "=" ? eq + 2 : eq + 1);
    return labels[key] === value;
  });
}

export async function startKubernetesServer(
  options: { token?: string } = {},
): Promise<KubernetesContractInfo & { close: () => Promise<void> }> {
  const token = options.token ?? `k8s-contract-${randomBytes(16).toString("hex")}`;
  const root = mkdtempSync(join(tmpdir(), "bw-k8s-contract-"));
  // The real exec runner, bundled from its source (the worker tests do not build the proxy image).
  // So are bw-unpack and bw-collect, which a pod runs from its tools (/bw/tools/bin) as its uid.
  const programs: Record<string, string> = {
    [RUNNER_COMMAND]: "exec-runner/main.ts",
    "/bw/tools/bin/bw-unpack": "unpack/main.ts",
    "/bw/tools/bin/bw-collect": "collect/main.ts",
    "bw-wiring": "wiring/main.ts",
  };
  const bundled: Record<string, string> = {};
  for (const [command, source] of Object.entries(programs)) {
    const outfile = join(root, source.replace(/\.ts$/, ".cjs"));
    await build({
      entryPoints: [resolve(import.meta.dirname, "../../proxy-image/src", source)],
      bundle: true,
      platform: "node",
      target: "node24",
      format: "cjs",
      outfile,
      logLevel: "warning",
    });
    bundled[command] = outfile;
  }

  const namespaces = new Map<string, Namespace>();
  const requests: RecordedRequest[] = [];
  let seq = 0;
  let resourceVersion = 1000;
  let nextIp = 10;
  const children = new Set<ChildProcess>();

  const nsOf = (name: string): Namespace => {
    let ns = namespaces.get(name);
    if (!ns) {
      ns = {
        objects: { services: new Map(), secrets: new Map(), networkpolicies: new Map() },
        pods: new Map(),
        options: { namespace: name },
      };
      namespaces.set(name, ns);
    }
    return ns;
  };

  const stamp = (obj: Json, ns: string) => {
    const metadata = (obj.metadata ?? {}) as Json;
    obj.metadata = {
      ...metadata,
      namespace: ns,
      uid: randomUUID(),
      resourceVersion: String(++resourceVersion),
      creationTimestamp: new Date().toISOString(),
    };
  };

  // ---- validation (the fields the API server would refuse) ----

  function checkObject(resource: Resource, ns: string, body: unknown): Json {
    if (!body || typeof body !== "object") throw badRequest("the body is not a JSON object");
    // Its own copy: the recorded request keeps the body as it was sent.
    const obj = structuredClone(body) as Json;
    const k = KIND[resource];
    if (obj.kind !== k.kind || obj.apiVersion !== k.apiVersion) {
      throw badRequest(
        `expected ${k.apiVersion} ${k.kind}, got ${String(obj.apiVersion)} ${String(obj.kind)}`,
      );
    }
    const metadata = (obj.metadata ?? {}) as Json;
    const name = String(metadata.name ?? "");
    if (metadata.namespace !== undefined && metadata.namespace !== ns) {
      throw badRequest(
        "the namespace of the provided object does not match the namespace sent on the request",
      );
    }
    const nameRule = resource === "services" ? DNS1035_LABEL : DNS1123_SUBDOMAIN;
    if (!nameRule.test(name)) throw invalid(k.kind, name, "metadata.name: Invalid value");
    for (const [key, value] of Object.entries((metadata.labels ?? {}) as Record<string, unknown>)) {
      if (!LABEL_KEY.test(key) || typeof value !== "string" || !LABEL_VALUE.test(value)) {
        throw invalid(k.kind, name, `metadata.labels: Invalid value: "${key}"`);
      }
    }
    const spec = (obj.spec ?? {}) as Json;
    if (resource === "pods") checkPod(name, spec);
    if (resource === "services") {
      const ports = (spec.ports ?? []) as Json[];
      if (ports.length === 0) throw invalid("Service", name, "spec.ports: Required value");
      const names = new Set<string>();
      for (const p of ports) {
        if (typeof p.port !== "number") throw invalid("Service", name, "spec.ports.port: Required value");
        const pn = String(p.name ?? "");
        if (ports.length > 1 && (!DNS1123_LABEL.test(pn) || pn.length > 15 || names.has(pn))) {
          throw invalid("Service", name, `spec.ports.name: Invalid value: "${pn}"`);
        }
        names.add(pn);
      }
    }
    if (resource === "secrets") {
      for (const [key, value] of Object.entries((obj.data ?? {}) as Record<string, unknown>)) {
        if (typeof value !== "string" || !/^[A-Za-z0-9+/]*={0,2}$/.test(value)) {
          throw invalid("Secret", name, `data[${key}]: Invalid value: not base64`);
        }
      }
    }
    if (
      resource === "networkpolicies" &&
      (typeof spec.podSelector !== "object" || spec.podSelector === null)
    ) {
      throw invalid("NetworkPolicy", name, "spec.podSelector: Required value");
    }
    return obj;
  }

  function checkPod(name: string, spec: Json) {
    const containers = (spec.containers ?? []) as Json[];
    if (containers.length === 0) throw invalid("Pod", name, "spec.containers: Required value");
    for (const c of [...containers, ...((spec.initContainers ?? []) as Json[])]) {
      if (!DNS1123_LABEL.test(String(c.name ?? "")))
        throw invalid("Pod", name, "spec.containers.name: Invalid value");
      if (!c.image) throw invalid("Pod", name, `spec.containers[${String(c.name)}].image: Required value`);
      for (const e of (c.env ?? []) as Json[]) {
        if (!/^[-._a-zA-Z][-._a-zA-Z0-9]*$/.test(String(e.name ?? ""))) {
          throw invalid("Pod", name, `spec.containers.env.name: Invalid value: "${String(e.name)}"`);
        }
      }
    }
    for (const a of (spec.hostAliases ?? []) as Json[]) {
      if (!/^[0-9]{1,3}(\.[0-9]{1,3}){3}$/.test(String(a.ip ?? ""))) {
        throw invalid("Pod", name, "spec.hostAliases.ip: Invalid value");
      }
      for (const h of (a.hostnames ?? []) as unknown[]) {
        if (!DNS1123_SUBDOMAIN.test(String(h)))
          throw invalid("Pod", name, `spec.hostAliases.hostnames: Invalid value: "${String(h)}"`);
      }
    }
  }

  function admit(ns: Namespace, name: string, spec: Json) {
    if (ns.options.podSecurity !== "baseline") return;
    const all = [...((spec.initContainers ?? []) as Json[]), ...((spec.containers ?? []) as Json[])];
    for (const c of all) {
      const add = (((c.securityContext as Json | undefined)?.capabilities as Json | undefined)?.add ??
        []) as string[];
      const bad = add.filter((cap) => !BASELINE_CAPS.has(cap));
      if (bad.length > 0 || spec.hostNetwork === true || spec.hostPID === true) {
        throw new Refusal(
          403,
          status(
            403,
            "Forbidden",
            `pods "${name}" is forbidden: violates PodSecurity "baseline:latest": non-default capabilities (container "${String(c.name)}" must not include ${bad.map((b) => `"${b}"`).join(", ")} in securityContext.capabilities.add)`,
            { name, kind: "pods" },
          ),
        );
      }
    }
  }

  // ---- pods ----

  /** A read of the pod moves it along its life: Pending → Running, Terminating → gone. */
  function observe(ns: Namespace, name: string, single: boolean): PodRecord | null {
    const rec = ns.pods.get(name);
    if (!rec) return null;
    if (rec.terminatingReads !== null) {
      if (!single) return rec;
      if (rec.terminatingReads >= 1) {
        ns.pods.delete(name);
        return null;
      }
      rec.terminatingReads++;
      return rec;
    }
    const st = rec.obj.status as Json;
    if (st.phase === "Pending") {
      if (rec.pendingReads > 0) rec.pendingReads--;
      else run(ns, rec);
    }
    return rec;
  }

  function run(ns: Namespace, rec: PodRecord) {
    const spec = rec.obj.spec as Json;
    const failure = ns.options.initFailure;
    const inits = (spec.initContainers ?? []) as Json[];
    const failed = failure && inits.some((c) => c.name === failure.container);
    const initStatuses = inits.map((c) => ({
      name: c.name,
      image: c.image,
      ready: false,
      restartCount: 0,
      state: {
        terminated:
          failed && c.name === failure?.container
            ? { exitCode: failure.exitCode, reason: "Error", message: failure.message }
            : { exitCode: 0, reason: "Completed" },
      },
    }));
    const containers = (spec.containers ?? []) as Json[];
    if (failed) {
      rec.obj.status = {
        phase: "Failed",
        initContainerStatuses: initStatuses,
        containerStatuses: containers.map((c) => ({
          name: c.name,
          image: c.image,
          ready: false,
          restartCount: 0,
          state: { waiting: { reason: "PodInitializing" } },
        })),
      };
      return;
    }
    const podIP = `10.244.${Math.floor(nextIp / 250)}.${(nextIp++ % 250) + 2}`;
    rec.obj.status = {
      phase: "Running",
      podIP,
      initContainerStatuses: initStatuses,
      containerStatuses: containers.map((c) => ({
        name: c.name,
        image: c.image,
        containerID: `containerd://${randomBytes(32).toString("hex")}`,
        ready: true,
        restartCount: 0,
        started: true,
        state: { running: { startedAt: new Date().toISOString() } },
        resources: c.resources,
      })),
    };
    for (const c of containers) mkdirSync(execDirOf(rec, String(c.name)), { recursive: true });
    writeFileSync(
      hostsFileOf(rec),
      kubeletHosts(podIP, String((rec.obj.metadata as Json).name), (spec.hostAliases ?? []) as Json[]),
    );
  }

  /**
   * The processes of a container's commands SIGKILLed as it dies; how many there were. The runner
   * starts each command in a session of its own (session id = its pid), so a command's children
   * are found by that session, also once the command itself exited (a daemon it left behind). A
   * process that left the session (setsid) escapes this model; the real runtime kills the whole
   * cgroup, and the real sealer's cgroup scan is tested in test/local/bw-init-seal.test.ts.
   */
  function killContainerProcesses(rec: PodRecord, container: string): number {
    const sessions = new Set(
      recordedExecs(execDirOf(rec, container))
        .map((e) => e.pid)
        .filter((p): p is number => p !== null),
    );
    let killed = 0;
    for (const entry of readdirSync("/proc")) {
      if (!/^\d+$/.test(entry)) continue;
      let stat: string;
      try {
        stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      } catch {
        continue; // gone meanwhile
      }
      // Fields after the command's ")": state, ppid, pgrp, session.
      const session = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[3]);
      if (!sessions.has(session)) continue;
      try {
        process.kill(Number(entry), "SIGCONT");
        process.kill(Number(entry), "SIGKILL");
        killed++;
      } catch {}
    }
    return killed;
  }
  function killPodProcesses(rec: PodRecord) {
    for (const c of ((rec.obj.spec as Json).containers ?? []) as Json[])
      killContainerProcesses(rec, String(c.name));
  }

  // ---- HTTP ----

  const readBody = (req: IncomingMessage): Promise<string> =>
    new Promise((resolveBody, reject) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => resolveBody(Buffer.concat(chunks).toString("utf8")));
      req.on("error", reject);
    });

  const send = (res: ServerResponse, code: number, body: unknown, type = "application/json") => {
    const text = typeof body === "string" ? body : JSON.stringify(body);
    res.writeHead(code, { "content-type": type, "content-length": Buffer.byteLength(text) });
    res.end(text);
  };

  const authOf = (req: IncomingMessage): RecordedRequest["auth"] => {
    const h = req.headers.authorization;
    if (!h) return "missing";
    return h === `Bearer ${token}` ? "ok" : "invalid";
  };

  function route(
    path: string,
  ): { ns: string; resource: Resource; name: string | null; sub: string | null } | null {
    const base = path.startsWith(API) ? API : path.startsWith(NETWORKING) ? NETWORKING : null;
    if (!base) return null;
    const parts = path.slice(base.length).split("/").map(decodeURIComponent);
    const [ns, resource, name, sub, ...rest] = parts;
    if (!ns || !resource || rest.length > 0) return null;
    const allowed: Resource[] = base === API ? ["pods", "services", "secrets"] : ["networkpolicies"];
    if (!allowed.includes(resource as Resource)) return null;
    if (sub && (resource !== "pods" || !["log", "exec", "resize"].includes(sub))) return null;
    return { ns, resource: resource as Resource, name: name ?? null, sub: sub ?? null };
  }

  async function api(
    req: IncomingMessage,
    record: RecordedRequest,
    url: URL,
  ): Promise<[number, unknown, string?]> {
    const r = route(url.pathname);
    if (!r) return [404, status(404, "NotFound", "the server could not find the requested resource")];
    const ns = nsOf(r.ns);
    const method = req.method ?? "GET";
    const text = method === "GET" || method === "DELETE" ? "" : await readBody(req);
    if (text) {
      try {
        record.body = JSON.parse(text);
      } catch {
        return [400, status(400, "BadRequest", "the body is not JSON")];
      }
    }
    const k = KIND[r.resource];
    if (r.resource === "pods") return pods(method, ns, r.name, r.sub, record.body, url, record);
    const store = ns.objects[r.resource];
    if (r.name === null) {
      if (method === "POST") {
        const obj = checkObject(r.resource, r.ns, record.body);
        const name = String((obj.metadata as Json).name);
        if (store.has(name)) {
          return [
            409,
            status(409, "AlreadyExists", `${r.resource} "${name}" already exists`, {
              name,
              kind: r.resource,
            }),
          ];
        }
        stamp(obj, r.ns);
        if (r.resource === "services") {
          const spec = obj.spec as Json;
          spec.clusterIP = `10.245.${Math.floor(nextIp / 250)}.${(nextIp++ % 250) + 2}`;
          spec.clusterIPs = [spec.clusterIP];
          for (const p of spec.ports as Json[]) {
            p.protocol ??= "TCP";
            p.targetPort ??= p.port;
          }
        }
        store.set(name, obj);
        return [201, obj];
      }
      if (method === "GET" && r.resource === "services") {
        const selector = url.searchParams.get("labelSelector");
        const items = [...store.values()].filter((o) =>
          matches(((o.metadata as Json).labels ?? {}) as Record<string, string>, selector),
        );
        return [
          200,
          {
            kind: k.list,
            apiVersion: k.apiVersion,
            metadata: { resourceVersion: String(resourceVersion) },
            items,
          },
        ];
      }
      return [405, status(405, "MethodNotAllowed", `the server does not allow this method on ${r.resource}`)];
    }
    const existing = store.get(r.name);
    if (method === "GET" && r.resource === "services") {
      if (!existing) throw notFound(r.resource, r.name);
      return [200, existing];
    }
    if (method === "PUT") {
      const obj = checkObject(r.resource, r.ns, record.body);
      if ((obj.metadata as Json).name !== r.name)
        throw badRequest("the name of the object does not match the name on the URL");
      if (!existing) throw notFound(r.resource, r.name);
      stamp(obj, r.ns);
      (obj.metadata as Json).uid = (existing.metadata as Json).uid;
      store.set(r.name, obj);
      return [200, obj];
    }
    if (method === "DELETE") {
      if (!existing) throw notFound(r.resource, r.name);
      store.delete(r.name);
      return [200, success(r.resource, r.name)];
    }
    return [405, status(405, "MethodNotAllowed", `the server does not allow this method on ${r.resource}`)];
  }

  function pods(
    method: string,
    ns: Namespace,
    name: string | null,
    sub: string | null,
    body: unknown,
    url: URL,
    record: RecordedRequest,
  ): [number, unknown, string?] {
    const nsName = ns.options.namespace;
    if (name === null) {
      if (method === "POST") {
        const obj = checkObject("pods", nsName, body);
        const podName = String((obj.metadata as Json).name);
        if (ns.pods.has(podName)) {
          return [
            409,
            status(409, "AlreadyExists", `pods "${podName}" already exists`, { name: podName, kind: "pods" }),
          ];
        }
        admit(ns, podName, obj.spec as Json);
        stamp(obj, nsName);
        const spec = obj.spec as Json;
        obj.status = {
          phase: "Pending",
          initContainerStatuses: ((spec.initContainers ?? []) as Json[]).map((c) => ({
            name: c.name,
            state: { waiting: { reason: "PodInitializing" } },
          })),
          containerStatuses: ((spec.containers ?? []) as Json[]).map((c) => ({
            name: c.name,
            state: { waiting: { reason: "ContainerCreating" } },
          })),
        };
        const dir = join(root, nsName, podName, randomUUID().slice(0, 8));
        mkdirSync(join(dir, "home"), { recursive: true });
        ns.pods.set(podName, {
          obj,
          pendingReads: ns.options.pendingReads ?? 0,
          terminatingReads: null,
          dir,
          log: "bw-proxy (contract server): started\n",
        });
        return [201, JSON.parse(JSON.stringify(obj))];
      }
      if (method === "GET") {
        const selector = url.searchParams.get("labelSelector");
        const items = [...ns.pods.keys()]
          .map((n) => observe(ns, n, false))
          .filter((p): p is PodRecord => p !== null)
          .map((p) => p.obj)
          .filter((o) => matches(((o.metadata as Json).labels ?? {}) as Record<string, string>, selector));
        return [
          200,
          {
            kind: "PodList",
            apiVersion: "v1",
            metadata: { resourceVersion: String(resourceVersion) },
            items,
          },
        ];
      }
      return [405, status(405, "MethodNotAllowed", "the server does not allow this method on pods")];
    }
    if (sub === null && method === "DELETE") {
      const rec = ns.pods.get(name);
      if (!rec) throw notFound("pods", name);
      if (rec.terminatingReads === null) {
        rec.terminatingReads = 0;
        const grace = Number(url.searchParams.get("gracePeriodSeconds") ?? 30);
        (rec.obj.metadata as Json).deletionTimestamp = new Date(Date.now() + grace * 1000).toISOString();
        (rec.obj.metadata as Json).deletionGracePeriodSeconds = grace;
        // The containers are killed (at once: the model has no grace period to wait out).
        killPodProcesses(rec);
        for (const cs of ((rec.obj.status as Json).containerStatuses ?? []) as Json[]) {
          if ((cs.state as Json).running) cs.state = { terminated: { exitCode: 137, reason: "Error" } };
        }
      }
      return [200, rec.obj];
    }
    const rec = observe(ns, name, true);
    if (!rec) throw notFound("pods", name);
    if (sub === null && method === "GET") return [200, rec.obj];
    if (sub === "log" && method === "GET") {
      const container = url.searchParams.get("container") ?? "";
      const cs = ((rec.obj.status as Json).containerStatuses as Json[] | undefined)?.find(
        (c) => c.name === container,
      );
      if (!cs) throw badRequest(`container ${container} is not valid for pod ${name}`);
      const state = cs.state as Json;
      if (!state.running && !state.terminated) {
        throw badRequest(`container "${container}" in pod "${name}" is waiting to start: ContainerCreating`);
      }
      const limit = Number(url.searchParams.get("limitBytes") ?? Number.MAX_SAFE_INTEGER);
      return [200, Buffer.from(rec.log).subarray(0, limit).toString("utf8"), "text/plain"];
    }
    if (sub === "resize" && method === "PATCH") {
      if (ns.options.resize === false) {
        return [404, status(404, "NotFound", "the server could not find the requested resource")];
      }
      if (record.contentType !== "application/strategic-merge-patch+json") {
        return [415, status(415, "UnsupportedMediaType", `the body of the request was in an unknown format`)];
      }
      const patch = body as { spec?: { containers?: Json[] } } & Json;
      if (
        Object.keys(patch).some((k) => k !== "spec") ||
        Object.keys(patch.spec ?? {}).some((k) => k !== "containers")
      ) {
        throw invalid("Pod", name, "spec: Forbidden: only resources may be changed by a resize");
      }
      const containers = (rec.obj.spec as Json).containers as Json[];
      for (const change of patch.spec?.containers ?? []) {
        const c = containers.find((x) => x.name === change.name);
        if (!c) throw invalid("Pod", name, `spec.containers[${String(change.name)}]: Not found`);
        if (Object.keys(change).some((k) => k !== "name" && k !== "resources")) {
          throw invalid("Pod", name, "spec: Forbidden: only resources may be changed by a resize");
        }
        const now = (c.resources ?? {}) as Record<string, Record<string, string>>;
        const want = (change.resources ?? {}) as Record<string, Record<string, string>>;
        c.resources = {
          ...now,
          requests: { ...now.requests, ...want.requests },
          limits: { ...now.limits, ...want.limits },
        };
        const cs = ((rec.obj.status as Json).containerStatuses as Json[] | undefined)?.find(
          (x) => x.name === c.name,
        );
        if (cs) cs.resources = c.resources;
      }
      (rec.obj.metadata as Json).resourceVersion = String(++resourceVersion);
      return [200, rec.obj];
    }
    return [
      405,
      status(405, "MethodNotAllowed", "the server does not allow this method on this pod subresource"),
    ];
  }

  // ---- exec ----

  function upgradeRefused(socket: import("node:stream").Duplex, code: number, body: Json) {
    const text = JSON.stringify(body);
    socket.end(
      `HTTP/1.1 ${code} ${{ 401: "Unauthorized", 404: "Not Found", 500: "Internal Server Error" }[code] ?? "Bad Request"}\r\n` +
        `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(text)}\r\nconnection: close\r\n\r\n${text}`,
    );
  }

  function execSession(
    ws: WebSocket,
    protocol: string,
    ns: Namespace,
    rec: PodRecord,
    container: string,
    command: string[],
    record: RecordedRequest,
  ) {
    const exec = record.exec as NonNullable<RecordedRequest["exec"]>;
    const finish = (exitCode: number | null, failure?: Json) => {
      exec.exitCode = exitCode;
      const st =
        failure ??
        (exitCode === 0
          ? { metadata: {}, status: "Success" }
          : {
              metadata: {},
              status: "Failure",
              message: `command terminated with non-zero exit code: error executing command [${command.join(" ")}], exit code ${exitCode}`,
              reason: "NonZeroExitCode",
              details: { causes: [{ reason: "ExitCode", message: String(exitCode) }] },
            });
      ws.send(Buffer.concat([Buffer.from([3]), Buffer.from(JSON.stringify(st))]));
      ws.close(1000);
    };
    const notFoundFailure = (): Json => ({
      metadata: {},
      status: "Failure",
      message: `OCI runtime exec failed: exec failed: unable to start container process: exec: "${command[0]}": executable file not found in $PATH: unknown`,
      reason: "InternalError",
      details: { causes: [{ message: "executable file not found" }] },
      code: 500,
    });
    if (container === "proxy") {
      // The proxy pod runs nothing here: its view is a scripted line.
      ws.on("message", () => {});
      if (command.length === 1 && command[0] === "bw-proxy-view") {
        const line = `${JSON.stringify({ contract: "bw-proxy-view", pod: (rec.obj.metadata as Json).name })}\n`;
        ws.send(Buffer.concat([Buffer.from([1]), Buffer.from(line)]));
        finish(0);
      } else {
        finish(null, notFoundFailure());
      }
      return;
    }
    let argv = command;
    let stdinFilter: ((line: string) => string) | null = null;
    if (container === "bw-seal") {
      const out = (text: string) => ws.send(Buffer.concat([Buffer.from([1]), Buffer.from(text)]));
      if (command[0] === "bw-init" && command[1] === "seal" && command.length === 3) {
        ws.on("message", () => {});
        const statuses = ((rec.obj.status as Json).containerStatuses ?? []) as Json[];
        const setup = statuses.find((c) => c.name === "setup");
        const ours = setup && String(setup.containerID) === `containerd://${command[2]}`;
        const killed = ours ? killContainerProcesses(rec, "setup") : 0;
        if (ours && !ns.options.setupSurvivesSeal) {
          // Its main process (the runner's hold) killed: the container ends, as the kubelet reports it.
          setup.state = { terminated: { exitCode: 137, reason: "Error" } };
          setup.ready = false;
        }
        out(`${JSON.stringify({ killed })}\n`);
        finish(0);
        return;
      }
      if (command[0] === "bw-init" && command[1] === "hosts" && command.length === 2) {
        // `head -n 1 | bw-wiring reinstall` on the pod's hosts file (this machine's paths).
        argv = ["bw-wiring", "reinstall"];
        stdinFilter = (line) => {
          const input = JSON.parse(line) as Json;
          if (input.hostsPath !== "/etc/hosts") throw new Error("the sealer rewrites /etc/hosts only");
          return `${JSON.stringify({ ...input, hostsPath: hostsFileOf(rec) })}\n`;
        };
      } else {
        finish(null, notFoundFailure());
        return;
      }
    }
    const program = bundled[argv[0] as string];
    // bw-wiring is on the sealer's PATH (the proxy image); the work image has only /bw/tools.
    if (!program || (argv[0] === "bw-wiring") !== (container === "bw-seal")) {
      finish(null, notFoundFailure());
      return;
    }
    const child = spawn(process.execPath, [program, ...argv.slice(1)], {
      cwd: rec.dir,
      env: {
        PATH: process.env.PATH ?? "/usr/bin:/bin",
        HOME: join(rec.dir, "home"),
        BW_EXEC_DIR: execDirOf(rec, container),
      },
      stdio: ["pipe", "pipe", "pipe"],
    });
    children.add(child);
    child.stdin.on("error", () => {});
    let line = "";
    ws.on("message", (data: Buffer) => {
      if (data.length === 0) return;
      if (data[0] === 0 && stdinFilter) {
        // One line, then stdin ends (as `head -n 1` ends it).
        exec.stdinBytes += data.length - 1;
        line += data.subarray(1).toString("utf8");
        const nl = line.indexOf("\n");
        if (nl !== -1 && !child.stdin.writableEnded) {
          exec.stdin = line.slice(0, nl + 1).slice(0, 64 * 1024);
          try {
            child.stdin.end(stdinFilter(line.slice(0, nl)));
          } catch {
            child.stdin.end("not json\n");
          }
        }
        return;
      }
      if (data[0] === 0) {
        // Text as text (the runner's JSON line); a binary stdin (a bundle) is counted, not kept.
        exec.stdinBytes += data.length - 1;
        if (exec.stdinBytes <= 64 * 1024) exec.stdin += data.subarray(1).toString("utf8");
        child.stdin.write(data.subarray(1));
      } else if (data[0] === 255 && protocol === "v5.channel.k8s.io" && data[1] === 0) {
        exec.closedStdin = true;
        child.stdin.end();
      }
    });
    child.stdout.on("data", (d: Buffer) => ws.send(Buffer.concat([Buffer.from([1]), d])));
    child.stderr.on("data", (d: Buffer) => ws.send(Buffer.concat([Buffer.from([2]), d])));
    child.on("close", (code) => {
      children.delete(child);
      finish(code ?? 1);
    });
    ws.on("close", () => {
      if (child.exitCode === null) child.kill("SIGKILL");
    });
    void ns;
  }

  const server = createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://127.0.0.1");
    if (url.pathname.startsWith("/_contract/")) {
      control(req, res, url).catch((e) => send(res, 500, { error: String(e) }));
      return;
    }
    const record: RecordedRequest = {
      seq: ++seq,
      method: req.method ?? "GET",
      path: url.pathname,
      query: queryOf(url),
      contentType: req.headers["content-type"] ?? null,
      body: null,
      auth: authOf(req),
      status: 0,
    };
    requests.push(record);
    const reply = (code: number, body: unknown, type?: string) => {
      record.status = code;
      send(res, code, body, type);
    };
    if (record.auth !== "ok") {
      req.resume();
      reply(401, status(401, "Unauthorized", "Unauthorized"));
      return;
    }
    api(req, record, url)
      .then(([code, body, type]) => reply(code, body, type))
      .catch((e: unknown) => {
        if (e instanceof Refusal) reply(e.code, e.body);
        else reply(500, status(500, "InternalError", String(e)));
      });
  });

  server.on("upgrade", (req, socket, head) => {
    const url = new URL(req.url ?? "/", "http://127.0.0.1");
    const command = url.searchParams.getAll("command");
    const container = url.searchParams.get("container");
    const record: RecordedRequest = {
      seq: ++seq,
      method: req.method ?? "GET",
      path: url.pathname,
      query: queryOf(url),
      contentType: null,
      body: null,
      auth: authOf(req),
      status: 0,
      exec: {
        protocol: null,
        command,
        container,
        stdin: "",
        stdinBytes: 0,
        closedStdin: false,
        exitCode: null,
      },
    };
    requests.push(record);
    const refuse = (code: number, body: Json) => {
      record.status = code;
      upgradeRefused(socket, code, body);
    };
    if (record.auth !== "ok") return refuse(401, status(401, "Unauthorized", "Unauthorized"));
    const r = route(url.pathname);
    if (r?.resource !== "pods" || r.sub !== "exec" || !r.name) {
      return refuse(404, status(404, "NotFound", "the server could not find the requested resource"));
    }
    const ns = nsOf(r.ns);
    const rec = observe(ns, r.name, true);
    if (!rec) return refuse(404, notFound("pods", r.name).body);
    if (rec.terminatingReads !== null || (rec.obj.status as Json).phase !== "Running") {
      return refuse(400, status(400, "BadRequest", `pod ${r.name} is not running`));
    }
    const containers = ((rec.obj.spec as Json).containers as Json[]).map((c) => c.name);
    if (!container || !containers.includes(container)) {
      return refuse(400, status(400, "BadRequest", `container ${container} is not valid for pod ${r.name}`));
    }
    const state = (((rec.obj.status as Json).containerStatuses ?? []) as Json[]).find(
      (c) => c.name === container,
    )?.state as Json | undefined;
    if (!state?.running) {
      // The kubelet's answer for an exec into a container that ended (or never started).
      return refuse(500, status(500, "InternalError", `container not found ("${container}")`));
    }
    if (command.length === 0)
      return refuse(400, status(400, "BadRequest", "you must specify at least 1 command"));
    const offered = String(req.headers["sec-websocket-protocol"] ?? "")
      .split(",")
      .map((p) => p.trim());
    const speaks = ns.options.execProtocols ?? ["v5.channel.k8s.io", "v4.channel.k8s.io"];
    const protocol = speaks.find((p) => offered.includes(p));
    if (!protocol)
      return refuse(400, status(400, "BadRequest", "no supported channel protocol was requested"));
    record.status = 101;
    (record.exec as NonNullable<RecordedRequest["exec"]>).protocol = protocol;
    const handler = new WebSocketServer({ noServer: true, handleProtocols: () => protocol });
    handler.handleUpgrade(req, socket, head, (ws) =>
      execSession(ws, protocol, ns, rec, container, command, record),
    );
  });

  async function control(req: IncomingMessage, res: ServerResponse, url: URL) {
    const ns = url.searchParams.get("namespace");
    if (url.pathname === "/_contract/requests" && req.method === "GET") {
      const list = ns
        ? requests.filter(
            (r) => r.path.startsWith(`${API}${ns}/`) || r.path.startsWith(`${NETWORKING}${ns}/`),
          )
        : requests;
      return send(res, 200, list);
    }
    if (url.pathname === "/_contract/process-states" && req.method === "GET" && ns) {
      // What `ps` would show in the pod: each exec's command (its session leader) by state letter.
      const rec = nsOf(ns).pods.get(url.searchParams.get("pod") ?? "");
      if (!rec) return send(res, 404, { error: "no such pod" });
      const states: Record<string, string | null> = {};
      for (const { execId, pid } of recordedExecs(join(rec.dir, "exec"))) {
        if (pid === null) continue;
        try {
          const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
          states[execId] = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] ?? null;
        } catch {
          states[execId] = null;
        }
      }
      return send(res, 200, states);
    }
    if (url.pathname === "/_contract/hosts" && ns) {
      // The pod's /etc/hosts: read, or replaced (what a setup stage's root could do to it).
      const rec = nsOf(ns).pods.get(url.searchParams.get("pod") ?? "");
      if (!rec) return send(res, 404, { error: "no such pod" });
      if (req.method === "PUT") {
        writeFileSync(hostsFileOf(rec), await readBody(req));
        return send(res, 204, "");
      }
      return send(res, 200, readFileSync(hostsFileOf(rec), "utf8"), "text/plain");
    }
    if (url.pathname === "/_contract/objects" && req.method === "GET" && ns) {
      const n = nsOf(ns);
      return send(res, 200, {
        pods: [...n.pods.values()].map((p) => p.obj),
        services: [...n.objects.services.values()],
        secrets: [...n.objects.secrets.values()],
        networkpolicies: [...n.objects.networkpolicies.values()],
      });
    }
    const body = JSON.parse((await readBody(req)) || "{}") as Json;
    if (url.pathname === "/_contract/options" && req.method === "POST") {
      const options = body as unknown as ContractOptions;
      nsOf(options.namespace).options = { ...nsOf(options.namespace).options, ...options };
      return send(res, 204, "");
    }
    if (url.pathname === "/_contract/terminate" && req.method === "POST") {
      const rec = nsOf(String(body.namespace)).pods.get(String(body.pod));
      if (!rec) return send(res, 404, { error: "no such pod" });
      const exitCode = Number(body.exitCode);
      rec.log += typeof body.log === "string" ? body.log : "";
      const st = rec.obj.status as Json;
      st.phase = exitCode === 0 ? "Succeeded" : "Failed";
      for (const cs of (st.containerStatuses ?? []) as Json[]) {
        cs.ready = false;
        cs.state = { terminated: { exitCode, reason: exitCode === 0 ? "Completed" : "Error" } };
      }
      return send(res, 204, "");
    }
    return send(res, 404, { error: "no such control endpoint" });
  }

  await new Promise<void>((ok, fail) => {
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => ok());
  });
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}`,
    token,
    close: async () => {
      for (const ns of namespaces.values()) for (const rec of ns.pods.values()) killPodProcesses(rec);
      for (const c of children) c.kill("SIGKILL");
      server.closeAllConnections();
      await new Promise<void>((ok) => server.close(() => ok()));
      rmSync(root, { recursive: true, force: true });
    },
  };
}

function queryOf(url: URL): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const [k, v] of url.searchParams) {
    out[k] ??= [];
    out[k].push(v);
  }
  return out;
}

/** Starts the contract server for the worker tests and provides where it is; closes with vitest. */
export async function startKubernetesContract(project: TestProject): Promise<void> {
  const server = await startKubernetesServer();
  project.provide("kubernetes", { url: server.url, token: server.token });
  project.vitest.onClose(() => server.close());
}
