import {
  type Answer,
  alreadyExists,
  badRequest,
  type Json,
  methodNotAllowed,
  notFound,
  type Resource,
  success,
} from "./kubernetes-api";
import { type Cluster, listOf, matches, type Namespace, nextAddress, stamp } from "./kubernetes-store";
import { checkObject } from "./kubernetes-validation";

// Services, Secrets and NetworkPolicies in the Kubernetes contract server (kubernetes-server.ts):
// the objects that only are stored (create, replace, delete; a Service is also read and listed,
// and is given its cluster IP from 10.245.0.0/16 and its ports' defaults). One module for the
// three: the API treats them alike, and so does the sandbox0 backend. Pods are kubernetes-pods.ts.

/** A request on one of the stored kinds in the namespace (`name` null: the collection). */
export function storedObjects(
  cluster: Cluster,
  method: string,
  ns: Namespace,
  r: { ns: string; resource: Exclude<Resource, "pods">; name: string | null },
  body: unknown,
  url: URL,
): Answer {
  const store = ns.objects[r.resource];
  if (r.name === null) {
    if (method === "POST") {
      const obj = checkObject(r.resource, r.ns, body);
      const name = String((obj.metadata as Json).name);
      if (store.has(name)) return alreadyExists(r.resource, name);
      stamp(cluster, obj, r.ns);
      if (r.resource === "services") {
        const spec = obj.spec as Json;
        spec.clusterIP = nextAddress(cluster, "10.245");
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
      return [200, listOf(cluster, r.resource, items)];
    }
    return methodNotAllowed(r.resource);
  }
  const existing = store.get(r.name);
  if (method === "GET" && r.resource === "services") {
    if (!existing) throw notFound(r.resource, r.name);
    return [200, existing];
  }
  if (method === "PUT") {
    const obj = checkObject(r.resource, r.ns, body);
    if ((obj.metadata as Json).name !== r.name)
      throw badRequest("the name of the object does not match the name on the URL");
    if (!existing) throw notFound(r.resource, r.name);
    stamp(cluster, obj, r.ns);
    (obj.metadata as Json).uid = (existing.metadata as Json).uid;
    store.set(r.name, obj);
    return [200, obj];
  }
  if (method === "DELETE") {
    if (!existing) throw notFound(r.resource, r.name);
    store.delete(r.name);
    return [200, success(r.resource, r.name)];
  }
  return methodNotAllowed(r.resource);
}
