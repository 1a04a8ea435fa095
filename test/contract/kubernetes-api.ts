import type { IncomingMessage, ServerResponse } from "node:http";
import type { RecordedRequest } from "./kubernetes-contract";

// The Kubernetes contract server's API surface (kubernetes-server.ts): the paths it serves, the
// kinds of object it keeps, its answers as metav1.Status (and the refusals that carry one), and
// the plain HTTP it is built on. Apart so every resource's module answers in the same shapes.

export const API = "/api/v1/namespaces/";
export const NETWORKING = "/apis/networking.k8s.io/v1/namespaces/";

export type Json = Record<string, unknown>;
export type Resource = "pods" | "services" | "secrets" | "networkpolicies";

export const KIND: Record<Resource, { kind: string; apiVersion: string; list: string }> = {
  pods: { kind: "Pod", apiVersion: "v1", list: "PodList" },
  services: { kind: "Service", apiVersion: "v1", list: "ServiceList" },
  secrets: { kind: "Secret", apiVersion: "v1", list: "SecretList" },
  networkpolicies: { kind: "NetworkPolicy", apiVersion: "networking.k8s.io/v1", list: "NetworkPolicyList" },
};

/** A handler's answer: the status code, the body, its content type when not JSON. */
export type Answer = [number, unknown, string?];

export function status(code: number, reason: string, message: string, details?: Json): Json {
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

export const success = (kind: string, name: string): Json => ({
  kind: "Status",
  apiVersion: "v1",
  metadata: {},
  status: "Success",
  details: { name, kind },
});

export class Refusal extends Error {
  constructor(
    readonly code: number,
    readonly body: Json,
  ) {
    super(String(body.message));
  }
}

export const invalid = (kind: string, name: string, why: string) =>
  new Refusal(422, status(422, "Invalid", `${kind} "${name}" is invalid: ${why}`, { name, kind }));
export const badRequest = (why: string) => new Refusal(400, status(400, "BadRequest", why));
export const notFound = (resource: string, name: string) =>
  new Refusal(404, status(404, "NotFound", `${resource} "${name}" not found`, { name, kind: resource }));
export const alreadyExists = (resource: string, name: string): Answer => [
  409,
  status(409, "AlreadyExists", `${resource} "${name}" already exists`, { name, kind: resource }),
];
export const noSuchResource = (): Answer => [
  404,
  status(404, "NotFound", "the server could not find the requested resource"),
];
export const methodNotAllowed = (what: string): Answer => [
  405,
  status(405, "MethodNotAllowed", `the server does not allow this method on ${what}`),
];

/** What an API path names, or null when it names nothing this server serves. */
export function route(
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

export function queryOf(url: URL): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const [k, v] of url.searchParams) {
    out[k] ??= [];
    out[k].push(v);
  }
  return out;
}

export const authOf = (req: IncomingMessage, token: string): RecordedRequest["auth"] => {
  const h = req.headers.authorization;
  if (!h) return "missing";
  return h === `Bearer ${token}` ? "ok" : "invalid";
};

export const readBody = (req: IncomingMessage): Promise<string> =>
  new Promise((resolveBody, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => resolveBody(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });

export const send = (res: ServerResponse, code: number, body: unknown, type = "application/json") => {
  const text = typeof body === "string" ? body : JSON.stringify(body);
  res.writeHead(code, { "content-type": type, "content-length": Buffer.byteLength(text) });
  res.end(text);
};
