import { readFileSync, writeFileSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { join } from "node:path";
import { recordedExecs } from "../../proxy-image/src/exec-runner/exec-runner";
import { API, type Json, NETWORKING, readBody, send } from "./kubernetes-api";
import type { ContractOptions } from "./kubernetes-contract";
import { hostsFileOf } from "./kubernetes-pods";
import { type Cluster, nsOf } from "./kubernetes-store";

// The Kubernetes contract server's own endpoints for the tests (kubernetes-server.ts), outside
// the API and without its token: GET /_contract/requests (what it recorded, per namespace),
// /_contract/objects (what it holds), /_contract/process-states (what `ps` would show in a pod),
// GET/PUT /_contract/hosts (a pod's /etc/hosts, as a setup stage's root could replace it), POST
// /_contract/options (a namespace's behaviour, ContractOptions) and /_contract/terminate (a proxy
// pod "exits").

/** A control request of the tests (/_contract/...): what was recorded or is held, and the knobs. */
export async function control(cluster: Cluster, req: IncomingMessage, res: ServerResponse, url: URL) {
  const ns = url.searchParams.get("namespace");
  if (url.pathname === "/_contract/requests" && req.method === "GET") {
    const list = ns
      ? cluster.requests.filter(
          (r) => r.path.startsWith(`${API}${ns}/`) || r.path.startsWith(`${NETWORKING}${ns}/`),
        )
      : cluster.requests;
    return send(res, 200, list);
  }
  if (url.pathname === "/_contract/process-states" && req.method === "GET" && ns) {
    // What `ps` would show in the pod: each exec's command (its session leader) by state letter.
    const rec = nsOf(cluster, ns).pods.get(url.searchParams.get("pod") ?? "");
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
    const rec = nsOf(cluster, ns).pods.get(url.searchParams.get("pod") ?? "");
    if (!rec) return send(res, 404, { error: "no such pod" });
    if (req.method === "PUT") {
      writeFileSync(hostsFileOf(rec), await readBody(req));
      return send(res, 204, "");
    }
    return send(res, 200, readFileSync(hostsFileOf(rec), "utf8"), "text/plain");
  }
  if (url.pathname === "/_contract/objects" && req.method === "GET" && ns) {
    const n = nsOf(cluster, ns);
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
    nsOf(cluster, options.namespace).options = { ...nsOf(cluster, options.namespace).options, ...options };
    return send(res, 204, "");
  }
  if (url.pathname === "/_contract/terminate" && req.method === "POST") {
    const rec = nsOf(cluster, String(body.namespace)).pods.get(String(body.pod));
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
