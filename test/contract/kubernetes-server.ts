import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type IncomingMessage } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestProject } from "vitest/node";
import { type Answer, noSuchResource, Refusal, readBody, route, send, status } from "./kubernetes-api";
import type { KubernetesContractInfo, RecordedRequest } from "./kubernetes-contract";
import { control } from "./kubernetes-control";
import { bundlePrograms, execUpgrade } from "./kubernetes-exec";
import { storedObjects } from "./kubernetes-objects";
import { killPodProcesses, pods } from "./kubernetes-pods";
import { type Cluster, newCluster, nsOf, recordRequest } from "./kubernetes-store";

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
//
// The server is split by resource: kubernetes-api.ts (paths, metav1.Status, HTTP),
// kubernetes-store.ts (the state every request shares), kubernetes-validation.ts (what the API
// server refuses, PodSecurity), kubernetes-pods.ts (pods and their modelled life),
// kubernetes-exec.ts (pods/exec), kubernetes-objects.ts (Services, Secrets, NetworkPolicies) and
// kubernetes-control.ts (the tests' /_contract/ endpoints).

export async function startKubernetesServer(
  options: { token?: string } = {},
): Promise<KubernetesContractInfo & { close: () => Promise<void> }> {
  const token = options.token ?? `k8s-contract-${randomBytes(16).toString("hex")}`;
  const root = mkdtempSync(join(tmpdir(), "bw-k8s-contract-"));
  const cluster = newCluster(token, root, await bundlePrograms(root));

  const server = createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://127.0.0.1");
    if (url.pathname.startsWith("/_contract/")) {
      control(cluster, req, res, url).catch((e) => send(res, 500, { error: String(e) }));
      return;
    }
    const record = recordRequest(cluster, req, url, { contentType: req.headers["content-type"] ?? null });
    const reply = (code: number, body: unknown, type?: string) => {
      record.status = code;
      send(res, code, body, type);
    };
    if (record.auth !== "ok") {
      req.resume();
      reply(401, status(401, "Unauthorized", "Unauthorized"));
      return;
    }
    api(cluster, req, record, url)
      .then(([code, body, type]) => reply(code, body, type))
      .catch((e: unknown) => {
        if (e instanceof Refusal) reply(e.code, e.body);
        else reply(500, status(500, "InternalError", String(e)));
      });
  });

  server.on("upgrade", (req, socket, head) => execUpgrade(cluster, req, socket, head));

  await new Promise<void>((ok, fail) => {
    server.once("error", fail);
    server.listen(0, "127.0.0.1", () => ok());
  });
  const { port } = server.address() as { port: number };
  return {
    url: `http://127.0.0.1:${port}`,
    token,
    close: async () => {
      for (const ns of cluster.namespaces.values()) for (const rec of ns.pods.values()) killPodProcesses(rec);
      for (const c of cluster.children) c.kill("SIGKILL");
      server.closeAllConnections();
      await new Promise<void>((ok) => server.close(() => ok()));
      rmSync(root, { recursive: true, force: true });
    },
  };
}

/** An API request: its body read and recorded, then answered by its resource's module. */
async function api(
  cluster: Cluster,
  req: IncomingMessage,
  record: RecordedRequest,
  url: URL,
): Promise<Answer> {
  const r = route(url.pathname);
  if (!r) return noSuchResource();
  const ns = nsOf(cluster, r.ns);
  const method = req.method ?? "GET";
  const text = method === "GET" || method === "DELETE" ? "" : await readBody(req);
  if (text) {
    try {
      record.body = JSON.parse(text);
    } catch {
      return [400, status(400, "BadRequest", "the body is not JSON")];
    }
  }
  if (r.resource === "pods") return pods(cluster, method, ns, r.name, r.sub, record.body, url, record);
  return storedObjects(cluster, method, ns, { ...r, resource: r.resource }, record.body, url);
}

/** Starts the contract server for the worker tests and provides where it is; closes with vitest. */
export async function startKubernetesContract(project: TestProject): Promise<void> {
  const server = await startKubernetesServer();
  project.provide("kubernetes", { url: server.url, token: server.token });
  project.vitest.onClose(() => server.close());
}
