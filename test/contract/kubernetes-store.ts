import type { ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import type { IncomingMessage } from "node:http";
import { authOf, type Json, KIND, queryOf, type Resource } from "./kubernetes-api";
import type { ContractOptions, RecordedRequest } from "./kubernetes-contract";

// What the Kubernetes contract server (kubernetes-server.ts) holds: its namespaces (made when
// named) with their objects and pods, the requests it recorded, the cluster-wide counters
// (resourceVersion, the next pod or Service IP), and the processes its pods' execs started. The
// resource modules take this one state, so a request of any kind sees what the others wrote.

export interface PodRecord {
  obj: Json;
  pendingReads: number;
  terminatingReads: number | null;
  dir: string;
  log: string;
}

export interface Namespace {
  objects: Record<Exclude<Resource, "pods">, Map<string, Json>>;
  pods: Map<string, PodRecord>;
  options: ContractOptions;
}

export interface Cluster {
  /** The one bearer token it accepts. */
  token: string;
  /** This machine's directory of the pods' files and the bundled programs (gone on close). */
  root: string;
  /** The programs a pod's exec runs for real, bundled (kubernetes-exec.ts), by their command. */
  bundled: Record<string, string>;
  namespaces: Map<string, Namespace>;
  requests: RecordedRequest[];
  seq: number;
  resourceVersion: number;
  nextIp: number;
  children: Set<ChildProcess>;
}

export const newCluster = (token: string, root: string, bundled: Record<string, string>): Cluster => ({
  token,
  root,
  bundled,
  namespaces: new Map(),
  requests: [],
  seq: 0,
  resourceVersion: 1000,
  nextIp: 10,
  children: new Set(),
});

export const nsOf = (c: Cluster, name: string): Namespace => {
  let ns = c.namespaces.get(name);
  if (!ns) {
    ns = {
      objects: { services: new Map(), secrets: new Map(), networkpolicies: new Map() },
      pods: new Map(),
      options: { namespace: name },
    };
    c.namespaces.set(name, ns);
  }
  return ns;
};

/** An API request, recorded as it comes in (its status is set as it is answered). */
export function recordRequest(
  c: Cluster,
  req: IncomingMessage,
  url: URL,
  fields: Pick<RecordedRequest, "contentType" | "exec">,
): RecordedRequest {
  const record: RecordedRequest = {
    seq: ++c.seq,
    method: req.method ?? "GET",
    path: url.pathname,
    query: queryOf(url),
    contentType: fields.contentType,
    body: null,
    auth: authOf(req, c.token),
    status: 0,
  };
  if (fields.exec) record.exec = fields.exec;
  c.requests.push(record);
  return record;
}

/** The metadata the API server sets on a written object. */
export const stamp = (c: Cluster, obj: Json, ns: string) => {
  const metadata = (obj.metadata ?? {}) as Json;
  obj.metadata = {
    ...metadata,
    namespace: ns,
    uid: randomUUID(),
    resourceVersion: String(++c.resourceVersion),
    creationTimestamp: new Date().toISOString(),
  };
};

/** The next free address in a /16 (`10.244` pods, `10.245` Services), from one counter. */
export const nextAddress = (c: Cluster, prefix: string) =>
  `${prefix}.${Math.floor(c.nextIp / 250)}.${(c.nextIp++ % 250) + 2}`;

/** A list answer of a resource's kind, at the cluster's resourceVersion. */
export const listOf = (c: Cluster, resource: Resource, items: Json[]): Json => ({
  kind: KIND[resource].list,
  apiVersion: KIND[resource].apiVersion,
  metadata: { resourceVersion: String(c.resourceVersion) },
  items,
});

/** A label selector (`k=v`, `k==v`, `k!=v`, `k`, comma-separated) against an object's labels. */
export function matches(labels: Record<string, string>, selector: string | null): boolean {
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
