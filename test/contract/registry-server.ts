import {
  createHash,
  createPublicKey,
  generateKeyPairSync,
  type KeyObject,
  randomUUID,
  verify,
} from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { TestProject } from "vitest/node";
import type { RecordedRequest, RegistryContractInfo } from "./registry-contract";

// CONTRACT SERVER, not a registry: the subset of the OCI distribution API the image build cache
// and its tests use, written from the OCI distribution spec and distribution's token
// authentication spec (its JWT profile), on loopback. A real registry cannot run in the worker
// tests, and the cache's guarantees rest on what a registry with token auth enforces, so this
// enforces it the way the specs say: the bearer JWT's ES256 signature against the trusted public
// key (looked up by `kid`, as distribution does), its issuer, audience (the service), exp and nbf
// (with distribution's 60 s leeway), and its `access` claim per repository and action (GET/HEAD
// need pull; POST/PUT/PATCH need pull and push, as distribution asks). Anything else is 401 with
// a Bearer challenge. It records every request (outcome only, never a token) and shows them at
// GET /_contract/requests; its realm (/token) only records that somebody called it.
//
// Served: GET /v2/; blob uploads (POST, monolithic POST ?digest=, PUT ?digest=, cross-repository
// mount); HEAD/GET blobs; PUT/GET/HEAD manifests by tag or digest, with Docker-Content-Digest.

const LEEWAY_SECONDS = 60;
const NAME = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$/;
const TAG = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/;
const DIGEST = /^sha256:[a-f0-9]{64}$/;
const MANIFEST_TYPES = new Set([
  "application/vnd.oci.image.index.v1+json",
  "application/vnd.oci.image.manifest.v1+json",
  "application/vnd.docker.distribution.manifest.list.v2+json",
  "application/vnd.docker.distribution.manifest.v2+json",
]);
const INDEX_TYPES = new Set([
  "application/vnd.oci.image.index.v1+json",
  "application/vnd.docker.distribution.manifest.list.v2+json",
]);

export interface RegistryServerOptions {
  issuer: string;
  service: string;
  /** kid → public key, like distribution's trusted keys. */
  trustedKeys: Map<string, KeyObject>;
}

interface Repo {
  blobs: Map<string, Buffer>;
  manifests: Map<string, { mediaType: string; body: Buffer }>;
  tags: Map<string, string>;
}

interface Claims {
  iss?: unknown;
  aud?: unknown;
  exp?: unknown;
  nbf?: unknown;
  sub?: unknown;
  jti?: unknown;
  access?: unknown;
}

type Auth =
  | { outcome: "none" | "invalid_token" }
  | { outcome: "ok"; claims: Claims; grants: (repo: string, action: string) => boolean };

export async function startRegistryServer(options: RegistryServerOptions) {
  const repos = new Map<string, Repo>();
  const uploads = new Map<string, { repo: string; chunks: Buffer[] }>();
  const requests: RecordedRequest[] = [];
  let origin = "";

  const repoOf = (name: string, create: boolean): Repo | undefined => {
    let repo = repos.get(name);
    if (!repo && create) {
      repo = { blobs: new Map(), manifests: new Map(), tags: new Map() };
      repos.set(name, repo);
    }
    return repo;
  };

  const authenticate = (req: IncomingMessage): Auth => {
    const match = /^Bearer ([^\s]+)$/i.exec(req.headers.authorization ?? "");
    if (!match?.[1]) return { outcome: "none" };
    const claims = verifyJwt(match[1], options);
    if (!claims) return { outcome: "invalid_token" };
    const access = Array.isArray(claims.access) ? (claims.access as unknown[]) : [];
    return {
      outcome: "ok",
      claims,
      grants: (repo, action) =>
        access.some((a) => {
          const entry = a as { type?: unknown; name?: unknown; actions?: unknown };
          return (
            entry.type === "repository" &&
            entry.name === repo &&
            Array.isArray(entry.actions) &&
            entry.actions.includes(action)
          );
        }),
    };
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((e) => {
      if (!res.headersSent) send(res, 500, { errors: [{ code: "UNKNOWN", message: String(e) }] });
    });
  });

  async function handle(req: IncomingMessage, res: ServerResponse) {
    const url = new URL(req.url ?? "/", origin);
    const method = req.method ?? "GET";
    const record: RecordedRequest = {
      method,
      path: url.pathname,
      repository: null,
      needed: [],
      auth: "none",
      subject: null,
      jti: null,
      status: 0,
    };
    const done = (status: number, body?: unknown, headers: Record<string, string> = {}) => {
      record.status = status;
      requests.push(record);
      send(res, status, method === "HEAD" ? undefined : body, headers);
    };

    if (url.pathname === "/_contract/requests") {
      const repo = url.searchParams.get("repository");
      const list = repo ? requests.filter((r) => r.repository === repo) : requests;
      return send(res, 200, list);
    }
    if (url.pathname === "/token") {
      // The realm: the broker mints its own tokens, so nobody should ever come here.
      return done(404, { errors: [{ code: "UNSUPPORTED", message: "no token service here" }] });
    }

    const route = parseRoute(url.pathname);
    if (!route) return done(404, error("NAME_UNKNOWN", "no such route"));
    record.repository = route.name;
    record.needed = method === "GET" || method === "HEAD" ? ["pull"] : ["pull", "push"];
    if (route.kind === "base") record.needed = [];

    const auth = authenticate(req);
    record.auth = auth.outcome;
    const challenge = (err?: string) => {
      const scope = route.name ? `,scope="repository:${route.name}:${record.needed.join(",")}"` : "";
      const e = err ? `,error="${err}"` : "";
      return {
        "www-authenticate": `Bearer realm="${origin}/token",service="${options.service}"${scope}${e}`,
      };
    };
    if (auth.outcome !== "ok") {
      return done(
        401,
        error("UNAUTHORIZED", "authentication required"),
        challenge(auth.outcome === "invalid_token" ? "invalid_token" : undefined),
      );
    }
    record.subject = typeof auth.claims.sub === "string" ? auth.claims.sub : null;
    record.jti = typeof auth.claims.jti === "string" ? auth.claims.jti : null;
    if (route.name && !record.needed.every((a) => auth.grants(route.name as string, a))) {
      // distribution answers a valid token without the scope with 401 and error=insufficient_scope.
      record.auth = "insufficient_scope";
      return done(
        401,
        error("DENIED", "requested access to the resource is denied"),
        challenge("insufficient_scope"),
      );
    }

    const body =
      method === "PUT" || method === "POST" || method === "PATCH" ? await readBody(req) : Buffer.alloc(0);
    const name = route.name ?? "";

    switch (route.kind) {
      case "base":
        if (method !== "GET") return done(405, error("UNSUPPORTED", "GET /v2/ only"));
        return done(200, {}, { "docker-distribution-api-version": "registry/2.0" });

      case "upload-start": {
        if (method !== "POST") return done(405, error("UNSUPPORTED", "POST to start an upload"));
        const mount = url.searchParams.get("mount");
        const from = url.searchParams.get("from");
        // A mount reads another repository: only with pull on it; otherwise a plain upload (202).
        if (mount && from && DIGEST.test(mount) && auth.grants(from, "pull")) {
          const blob = repos.get(from)?.blobs.get(mount);
          if (blob) {
            repoOf(name, true)?.blobs.set(mount, blob);
            return done(201, undefined, blobHeaders(name, mount));
          }
        }
        const digest = url.searchParams.get("digest");
        if (digest) {
          if (!DIGEST.test(digest) || sha256(body) !== digest)
            return done(400, error("DIGEST_INVALID", "digest mismatch"));
          repoOf(name, true)?.blobs.set(digest, body);
          return done(201, undefined, blobHeaders(name, digest));
        }
        const id = randomUUID();
        uploads.set(id, { repo: name, chunks: [] });
        return done(202, undefined, {
          location: `/v2/${name}/blobs/uploads/${id}`,
          "docker-upload-uuid": id,
          range: "0-0",
        });
      }

      case "upload": {
        const upload = uploads.get(route.ref);
        if (!upload || upload.repo !== name) return done(404, error("BLOB_UPLOAD_UNKNOWN", "no such upload"));
        if (method === "PATCH") {
          upload.chunks.push(body);
          const size = upload.chunks.reduce((n, c) => n + c.length, 0);
          return done(202, undefined, {
            location: `/v2/${name}/blobs/uploads/${route.ref}`,
            range: `0-${Math.max(0, size - 1)}`,
          });
        }
        if (method !== "PUT") return done(405, error("UNSUPPORTED", "PATCH or PUT an upload"));
        const digest = url.searchParams.get("digest") ?? "";
        const whole = Buffer.concat([...upload.chunks, body]);
        if (!DIGEST.test(digest) || sha256(whole) !== digest)
          return done(400, error("DIGEST_INVALID", "digest mismatch"));
        uploads.delete(route.ref);
        repoOf(name, true)?.blobs.set(digest, whole);
        return done(201, undefined, blobHeaders(name, digest));
      }

      case "blob": {
        if (method !== "GET" && method !== "HEAD")
          return done(405, error("UNSUPPORTED", "GET or HEAD a blob"));
        const blob = repos.get(name)?.blobs.get(route.ref);
        if (!blob) return done(404, error("BLOB_UNKNOWN", "blob unknown to registry"));
        record.status = 200;
        requests.push(record);
        res.writeHead(200, {
          "content-type": "application/octet-stream",
          "content-length": String(blob.length),
          "docker-content-digest": route.ref,
        });
        return res.end(method === "HEAD" ? undefined : blob);
      }

      case "manifest": {
        if (method === "PUT") return putManifest(name, route.ref, req, body, done);
        if (method !== "GET" && method !== "HEAD")
          return done(405, error("UNSUPPORTED", "GET, HEAD or PUT a manifest"));
        const repo = repos.get(name);
        if (!repo) return done(404, error("NAME_UNKNOWN", "repository name not known to registry"));
        const digest = DIGEST.test(route.ref) ? route.ref : repo.tags.get(route.ref);
        const manifest = digest ? repo.manifests.get(digest) : undefined;
        if (!digest || !manifest) return done(404, error("MANIFEST_UNKNOWN", "manifest unknown"));
        record.status = 200;
        requests.push(record);
        res.writeHead(200, {
          "content-type": manifest.mediaType,
          "content-length": String(manifest.body.length),
          "docker-content-digest": digest,
        });
        return res.end(method === "HEAD" ? undefined : manifest.body);
      }
    }
  }

  function putManifest(
    name: string,
    reference: string,
    req: IncomingMessage,
    body: Buffer,
    done: (status: number, body?: unknown, headers?: Record<string, string>) => void,
  ) {
    const mediaType = (req.headers["content-type"] ?? "").split(";")[0]?.trim() ?? "";
    if (!MANIFEST_TYPES.has(mediaType))
      return done(400, error("MANIFEST_INVALID", `unsupported ${mediaType}`));
    let parsed: {
      mediaType?: string;
      config?: { digest?: string };
      layers?: { digest?: string }[];
      manifests?: { digest?: string }[];
    };
    try {
      parsed = JSON.parse(body.toString("utf8"));
    } catch {
      return done(400, error("MANIFEST_INVALID", "not JSON"));
    }
    if (parsed.mediaType !== undefined && parsed.mediaType !== mediaType) {
      return done(400, error("MANIFEST_INVALID", "mediaType does not match Content-Type"));
    }
    const repo = repoOf(name, true) as Repo;
    if (INDEX_TYPES.has(mediaType)) {
      for (const m of parsed.manifests ?? []) {
        if (!m.digest || !repo.manifests.has(m.digest))
          return done(400, error("MANIFEST_UNKNOWN", "child manifest unknown"));
      }
    } else {
      for (const d of [parsed.config, ...(parsed.layers ?? [])]) {
        if (!d?.digest || !repo.blobs.has(d.digest))
          return done(400, error("MANIFEST_BLOB_UNKNOWN", "blob unknown"));
      }
    }
    const digest = sha256(body);
    if (DIGEST.test(reference)) {
      if (reference !== digest) return done(400, error("DIGEST_INVALID", "digest mismatch"));
    } else if (!TAG.test(reference)) {
      return done(400, error("TAG_INVALID", "invalid tag"));
    }
    repo.manifests.set(digest, { mediaType, body });
    if (!DIGEST.test(reference)) repo.tags.set(reference, digest);
    return done(201, undefined, {
      location: `/v2/${name}/manifests/${digest}`,
      "docker-content-digest": digest,
    });
  }

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
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

type Route =
  | { kind: "base"; name: null; ref: "" }
  | { kind: "upload-start" | "upload" | "blob" | "manifest"; name: string; ref: string };

function parseRoute(path: string): Route | null {
  if (path === "/v2/" || path === "/v2") return { kind: "base", name: null, ref: "" };
  const m = /^\/v2\/(.+)\/(manifests|blobs\/uploads|blobs)\/?([^/]*)$/.exec(path);
  if (!m?.[1] || !NAME.test(m[1])) return null;
  const [, name, what, ref = ""] = m;
  if (what === "blobs/uploads") return { kind: ref ? "upload" : "upload-start", name, ref };
  if (what === "blobs") return DIGEST.test(ref) ? { kind: "blob", name, ref } : null;
  return ref ? { kind: "manifest", name, ref } : null;
}

/** The claims of a token that verifies under `options`, else null. */
function verifyJwt(token: string, options: RegistryServerOptions): Claims | null {
  const parts = token.split(".");
  if (parts.length !== 3) return null;
  const [h, p, s] = parts as [string, string, string];
  let header: { alg?: unknown; kid?: unknown };
  let claims: Claims;
  try {
    header = JSON.parse(Buffer.from(h, "base64url").toString("utf8"));
    claims = JSON.parse(Buffer.from(p, "base64url").toString("utf8"));
  } catch {
    return null;
  }
  // Only the algorithm the registry was configured for: never "none", never an HMAC.
  if (header.alg !== "ES256" || typeof header.kid !== "string") return null;
  const key = options.trustedKeys.get(header.kid);
  if (!key) return null;
  const signature = Buffer.from(s, "base64url");
  const valid = verify("sha256", Buffer.from(`${h}.${p}`), { key, dsaEncoding: "ieee-p1363" }, signature);
  if (!valid) return null;
  const now = Math.floor(Date.now() / 1000);
  const audiences = Array.isArray(claims.aud) ? claims.aud : [claims.aud];
  if (claims.iss !== options.issuer || !audiences.includes(options.service)) return null;
  if (typeof claims.exp !== "number" || claims.exp + LEEWAY_SECONDS < now) return null;
  if (typeof claims.nbf === "number" && claims.nbf - LEEWAY_SECONDS > now) return null;
  return claims;
}

/** distribution's key id for a trusted key (libtrust): base32 of SHA-256(SPKI DER)[:30], 4 by 4. */
export function libtrustKeyId(key: KeyObject): string {
  const der = key.export({ type: "spki", format: "der" });
  const sum = createHash("sha256").update(der).digest().subarray(0, 30);
  const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
  let bits = "";
  for (const b of sum) bits += b.toString(2).padStart(8, "0");
  let out = "";
  for (let i = 0; i + 5 <= bits.length; i += 5) out += alphabet[Number.parseInt(bits.slice(i, i + 5), 2)];
  return (out.match(/.{4}/g) ?? []).join(":");
}

const sha256 = (bytes: Buffer) => `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
const error = (code: string, message: string) => ({ errors: [{ code, message }] });
const blobHeaders = (name: string, digest: string) => ({
  location: `/v2/${name}/blobs/${digest}`,
  "docker-content-digest": digest,
});

function send(res: ServerResponse, status: number, body?: unknown, headers: Record<string, string> = {}) {
  const text = body === undefined ? "" : JSON.stringify(body);
  res.writeHead(status, {
    ...(body === undefined ? {} : { "content-type": "application/json" }),
    "content-length": String(Buffer.byteLength(text)),
    ...headers,
  });
  res.end(text);
}

async function readBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

/**
 * Global setup: a fresh ES256 keypair (the JWK carries no `kid`, so the broker signs with the
 * key's libtrust id, the way a registry given a certificate bundle knows it), the contract
 * registry trusting its public half, both provided to the worker tests as `registry`.
 */
export async function startRegistryContract(project: TestProject): Promise<void> {
  const { privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const publicKey = createPublicKey(privateKey);
  const info = { service: "registry.contract.test", issuer: "benchwright-broker" };
  const server = await startRegistryServer({
    ...info,
    trustedKeys: new Map([[libtrustKeyId(publicKey), publicKey]]),
  });
  const jwk = privateKey.export({ format: "jwk" });
  const provided: RegistryContractInfo = { ...info, url: server.url, signingKey: JSON.stringify(jwk) };
  project.provide("registry", provided);
  project.vitest.onClose(() => server.close());
}
