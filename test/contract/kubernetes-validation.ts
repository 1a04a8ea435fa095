import { badRequest, invalid, type Json, KIND, Refusal, type Resource, status } from "./kubernetes-api";
import type { Namespace } from "./kubernetes-store";

// What the Kubernetes contract server (kubernetes-server.ts) refuses before it writes an object:
// the fields the API server validates (kind and apiVersion, names, labels, the pod, Service,
// Secret and NetworkPolicy fields the sandbox0 backend sends), and PodSecurity admission
// (baseline, checked on capabilities only). Apart so every resource is checked by the same rules.

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

/** The object of a create or replace, checked, as its own copy (the recorded body stays as sent). */
export function checkObject(resource: Resource, ns: string, body: unknown): Json {
  if (!body || typeof body !== "object") throw badRequest("the body is not a JSON object");
  // Its own copy: the recorded request keeps the body as it was sent.
  const obj = structuredClone(body) as Json;
  const k = KIND[resource];
  if (obj.kind !== k.kind || obj.apiVersion !== k.apiVersion) {
    throw badRequest(`expected ${k.apiVersion} ${k.kind}, got ${String(obj.apiVersion)} ${String(obj.kind)}`);
  }
  const metadata = (obj.metadata ?? {}) as Json;
  const name = String(metadata.name ?? "");
  if (metadata.namespace !== undefined && metadata.namespace !== ns) {
    throw badRequest("the namespace of the provided object does not match the namespace sent on the request");
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
    if (obj.type === "kubernetes.io/dockerconfigjson") {
      const data = (obj.data ?? {}) as Record<string, string>;
      let config: Json | null = null;
      try {
        config = JSON.parse(atob(data[".dockerconfigjson"] ?? "")) as Json;
      } catch {}
      if (typeof config?.auths !== "object" || config.auths === null) {
        throw invalid(
          "Secret",
          name,
          "data[.dockerconfigjson]: Invalid value: invalid character looking for beginning of value",
        );
      }
    }
  }
  if (resource === "networkpolicies" && (typeof spec.podSelector !== "object" || spec.podSelector === null)) {
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
  for (const s of (spec.imagePullSecrets ?? []) as Json[]) {
    if (!DNS1123_SUBDOMAIN.test(String(s.name ?? ""))) {
      throw invalid("Pod", name, "spec.imagePullSecrets.name: Invalid value");
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

/** PodSecurity admission of a new pod in the namespace (only when it enforces baseline). */
export function admit(ns: Namespace, name: string, spec: Json) {
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
