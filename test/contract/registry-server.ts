import { createHash } from "node:crypto";
import { createServer, type ServerResponse } from "node:http";
import type { TestProject } from "vitest/node";
import type { MisbehaviourName, RecordedRequest, RegistryContractInfo } from "./registry-contract";

// CONTRACT SERVER, not a registry: a registry that MISBEHAVES, for the few answers the suite's
// real registry (test/setup/registry.ts, distribution 2.8) will not give, so that the broker's
// registry reader (src/images/registry.ts) is shown to refuse them: a Docker-Content-Digest that
// disagrees with the body, a manifest over distribution's 4 MiB (declared, or only found while
// reading), a redirect (which would carry the bearer token elsewhere), a challenge that is not
// Bearer, and a 5xx. Everything a registry does right (token auth,
// scopes, pushes, mounts, digests) is tested against the real one.
//
// GET/HEAD /v2/contract/<misbehaviour>/manifests/<ref>: without an Authorization header, a
// Bearer challenge for `service` (as a registry with token auth answers first); with any Bearer
// token, the misbehaviour. It records every request (never a token) at GET /_contract/requests;
// its realm (/token) and its redirect target (/elsewhere) only record that somebody came.

const SERVICE = "registry.contract.test";
const MAX_MANIFEST_BYTES = 4 * 1024 * 1024;
const OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json";

const BEHAVIOURS: Record<MisbehaviourName, true> = {
  "digest-mismatch": true,
  "oversized-declared": true,
  "oversized-streamed": true,
  redirect: true,
  "basic-challenge": true,
  "server-error": true,
};

export async function startRegistryServer() {
  const requests: RecordedRequest[] = [];
  let origin = "";

  const server = createServer((req, res) => {
    const url = new URL(req.url ?? "/", origin);
    if (url.pathname === "/_contract/requests") return send(res, 200, JSON.stringify(requests));
    const authorized = /^Bearer \S+$/i.test(req.headers.authorization ?? "");
    requests.push({ method: req.method ?? "GET", path: url.pathname, authorized });
    if (url.pathname === "/token" || url.pathname === "/elsewhere") return send(res, 404, "{}");

    const m = /^\/v2\/contract\/([a-z-]+)\/manifests\/[^/]+$/.exec(url.pathname);
    const behaviour = m?.[1] as MisbehaviourName | undefined;
    if (!behaviour || !BEHAVIOURS[behaviour]) return send(res, 404, '{"errors":[{"code":"NAME_UNKNOWN"}]}');
    const challenge = (scheme: string, service: string) => ({
      "www-authenticate": `${scheme} realm="${origin}/token",service="${service}",scope="repository:contract/${behaviour}:pull"`,
    });
    if (behaviour === "basic-challenge") return send(res, 401, "{}", challenge("Basic", SERVICE));
    if (!authorized) return send(res, 401, "{}", challenge("Bearer", SERVICE));

    const manifest = JSON.stringify({ schemaVersion: 2, mediaType: OCI_MANIFEST, layers: [] });
    switch (behaviour) {
      case "digest-mismatch":
        return send(res, 200, manifest, {
          "content-type": OCI_MANIFEST,
          "docker-content-digest": sha256(`${manifest} `),
        });
      case "oversized-declared":
        // Its Content-Length says it is larger than any manifest may be.
        return send(res, 200, manifest + " ".repeat(MAX_MANIFEST_BYTES), { "content-type": OCI_MANIFEST });
      case "oversized-streamed": {
        // No length given: only reading shows it is too large.
        res.writeHead(200, { "content-type": OCI_MANIFEST });
        res.write(manifest);
        res.end(" ".repeat(MAX_MANIFEST_BYTES));
        return;
      }
      case "redirect":
        return send(res, 307, "", { location: `${origin}/elsewhere` });
      case "server-error":
        return send(res, 500, '{"errors":[{"code":"UNKNOWN"}]}');
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  // Never what keeps the test process alive: it is closed with vitest, and otherwise dies with it.
  server.unref();
  const { port } = server.address() as { port: number };
  origin = `http://127.0.0.1:${port}`;
  return {
    url: origin,
    service: SERVICE,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const sha256 = (text: string) => `sha256:${createHash("sha256").update(text).digest("hex")}`;

function send(res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}) {
  res.writeHead(status, {
    ...(body ? { "content-type": "application/json" } : {}),
    "content-length": String(Buffer.byteLength(body)),
    ...headers,
  });
  res.end(body);
}

/** Global setup: the misbehaving registry, provided to the worker tests as `registryContract`. */
export async function startRegistryContract(project: TestProject): Promise<void> {
  const server = await startRegistryServer();
  const provided: RegistryContractInfo = { url: server.url, service: server.service };
  project.provide("registryContract", provided);
  project.vitest.onClose(() => server.close());
}
