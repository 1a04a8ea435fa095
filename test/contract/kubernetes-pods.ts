import { randomBytes, randomUUID } from "node:crypto";
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { recordedExecs } from "../../proxy-image/src/exec-runner/exec-runner";
import {
  type Answer,
  alreadyExists,
  badRequest,
  invalid,
  type Json,
  methodNotAllowed,
  noSuchResource,
  notFound,
  status,
} from "./kubernetes-api";
import type { RecordedRequest } from "./kubernetes-contract";
import {
  type Cluster,
  listOf,
  matches,
  type Namespace,
  nextAddress,
  type PodRecord,
  stamp,
} from "./kubernetes-store";
import { admit, checkObject } from "./kubernetes-validation";

// Pods in the Kubernetes contract server (kubernetes-server.ts): create, list, get, delete, log
// and resize, and the modelled life of a pod: Pending in the create answer, Running (init
// containers Completed, an IP from 10.244.0.0/16, its /etc/hosts written as the kubelet writes
// it) on the next read, Terminating for one more GET once deleted, then gone; deleting it kills
// the processes its execs started. pods/exec is kubernetes-exec.ts.

/** Each container's runner state: `work`'s as before, any other container's beside it. */
export const execDirOf = (rec: PodRecord, container: string) =>
  join(rec.dir, container === "work" ? "exec" : `exec-${container}`);
export const hostsFileOf = (rec: PodRecord) => join(rec.dir, "etc-hosts");

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

export function observe(cluster: Cluster, ns: Namespace, name: string, single: boolean): PodRecord | null {
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
    else run(cluster, ns, rec);
  }
  return rec;
}

function run(cluster: Cluster, ns: Namespace, rec: PodRecord) {
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
  const podIP = nextAddress(cluster, "10.244");
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
export function killContainerProcesses(rec: PodRecord, container: string): number {
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
export function killPodProcesses(rec: PodRecord) {
  for (const c of ((rec.obj.spec as Json).containers ?? []) as Json[])
    killContainerProcesses(rec, String(c.name));
}

/** A request on pods (a pod by name, or one of its subresources) in the namespace. */
export function pods(
  cluster: Cluster,
  method: string,
  ns: Namespace,
  name: string | null,
  sub: string | null,
  body: unknown,
  url: URL,
  record: RecordedRequest,
): Answer {
  const nsName = ns.options.namespace;
  if (name === null) {
    if (method === "POST") {
      const obj = checkObject("pods", nsName, body);
      const podName = String((obj.metadata as Json).name);
      if (ns.pods.has(podName)) return alreadyExists("pods", podName);
      admit(ns, podName, obj.spec as Json);
      stamp(cluster, obj, nsName);
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
      const dir = join(cluster.root, nsName, podName, randomUUID().slice(0, 8));
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
        .map((n) => observe(cluster, ns, n, false))
        .filter((p): p is PodRecord => p !== null)
        .map((p) => p.obj)
        .filter((o) => matches(((o.metadata as Json).labels ?? {}) as Record<string, string>, selector));
      return [200, listOf(cluster, "pods", items)];
    }
    return methodNotAllowed("pods");
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
  const rec = observe(cluster, ns, name, true);
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
    if (ns.options.resize === false) return noSuchResource();
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
    (rec.obj.metadata as Json).resourceVersion = String(++cluster.resourceVersion);
    return [200, rec.obj];
  }
  return methodNotAllowed("this pod subresource");
}
