import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { dirname, relative, resolve } from "node:path";
import { HttpError } from "./e2b-builds";
import type { Runner } from "./e2b-processes";
import { processService } from "./e2b-processes";
import type { Box, E2bStore, EnvdCall } from "./e2b-store";

// The E2B contract server's envd, the API inside each sandbox (e2b-server.ts routes a request
// with an E2b-Sandbox-Id here): which sandbox, its access token, the health check and the files
// API; the process API is e2b-processes.ts. Apart from the platform API: envd is keyed by the
// sandbox's own token, never by the API key.
//
// envd (E2b-Sandbox-Id selects the sandbox, X-Access-Token must be its envdAccessToken, the user
// is the Basic authorization's name):
//   process.Process/*               the process API: see e2b-processes.ts
//   GET /health                                                  204
//   GET  /files?path=&username=     the file's bytes (application/octet-stream) | 404 | 400 a dir
//   POST /files?path=&username=     multipart/form-data (`file` parts) or application/octet-stream
//                                   → 200 [EntryInfo]; parent directories made
//   (envd's files API from envd.yaml, `info.version` 0.1.1 in e2b-dev/infra, as SDK 2.51.0's
//   generated types carry it; answers as in its examples: errors {code, message}, 401 for an
//   unknown user)
// envd calls to a paused sandbox are answered 502 as E2B's edge does.
//
// Filesystem model (documented, not E2B's): each sandbox's home, for every user, is its
// directory on this machine; a relative path resolves there (as envd resolves it against the
// user's home) and an absolute path must lie inside it (400 otherwise). The file's owner is this
// machine's test user whatever the `username`, which is recorded, and must be root or user.

/** A path of the files API on this machine: relative to the sandbox's home, never outside it. */
function homePath(box: Box, path: string | null): string {
  if (!path) throw new HttpError(400, "path is required");
  const target = path.startsWith("/") ? resolve(path) : resolve(box.dir, path);
  const inside = relative(box.dir, target);
  if (inside === "" || inside.startsWith("..") || resolve(box.dir, inside) !== target) {
    throw new HttpError(
      400,
      `path '${path}' is outside the sandbox's home (the contract's filesystem model)`,
    );
  }
  return target;
}

/** The files of an upload: a raw body (octet-stream, the path in the query) or multipart parts. */
function uploadedFiles(
  type: string,
  raw: Buffer,
  queryPath: string | null,
): Array<{ path: string; data: Buffer }> {
  if (type.startsWith("application/octet-stream")) {
    if (!queryPath)
      throw new HttpError(400, "the path query parameter is required for an octet-stream upload");
    return [{ path: queryPath, data: raw }];
  }
  const boundary = /^multipart\/form-data;.*boundary=("?)([^";]+)\1/i.exec(type)?.[2];
  if (!boundary)
    throw new HttpError(400, "the body is neither multipart/form-data nor application/octet-stream");
  const out: Array<{ path: string; data: Buffer }> = [];
  const delimiter = Buffer.from(`--${boundary}`);
  let at = raw.indexOf(delimiter);
  while (at !== -1) {
    const next = raw.indexOf(delimiter, at + delimiter.length);
    if (next === -1) break;
    const part = raw.subarray(at + delimiter.length + 2, next - 2); // CRLF after the delimiter and before the next
    const split = part.indexOf("\r\n\r\n");
    const head = part.subarray(0, split).toString();
    const name = /name="([^"]*)"/.exec(head)?.[1];
    const filename = /filename="([^"]*)"/.exec(head)?.[1];
    if (name === "file") out.push({ path: queryPath ?? filename ?? "", data: part.subarray(split + 4) });
    at = next;
  }
  if (out.length === 0) throw new HttpError(400, "no file part in the upload");
  return out;
}

/** envd of every sandbox of one server: answers a request that names its sandbox. */
export function envdApi(store: E2bStore, runner: Runner): (call: EnvdCall) => void {
  const processes = processService(store, runner);
  return (call) => {
    const { req, res, url, raw, user, record, json } = call;
    const envdSandbox = req.headers["e2b-sandbox-id"];
    const box = store.boxes.get(envdSandbox as string);
    if (!box) return json(502, { code: 502, message: `The sandbox ${String(envdSandbox)} was not found` });
    const token = req.headers["x-access-token"];
    record.accessToken = token === undefined ? "absent" : token === box.envdAccessToken ? "ok" : "wrong";
    if (box.state === "paused")
      return json(502, { code: 502, message: `The sandbox ${box.sandboxID} is paused` });
    if (req.method === "GET" && url.pathname === "/health") return json(204, null);
    if (url.pathname === "/files") {
      if (record.accessToken !== "ok") return json(401, { code: 401, message: "invalid access token" });
      const fileUser = url.searchParams.get("username") ?? user ?? "user";
      if (fileUser !== "root" && fileUser !== "user") {
        return json(401, {
          code: 401,
          message: `error looking up user '${fileUser}': user: unknown user ${fileUser}`,
        });
      }
      if (req.method === "GET") {
        const path = homePath(box, url.searchParams.get("path"));
        if (!existsSync(path)) {
          return json(404, { code: 404, message: `path '${url.searchParams.get("path")}' does not exist` });
        }
        if (statSync(path).isDirectory()) {
          return json(400, { code: 400, message: `path '${url.searchParams.get("path")}' is a directory` });
        }
        const bytes = readFileSync(path);
        record.status = 200;
        res.writeHead(200, { "content-type": "application/octet-stream", "content-length": bytes.length });
        return res.end(bytes);
      }
      if (req.method === "POST") {
        const files = uploadedFiles(req.headers["content-type"] ?? "", raw, url.searchParams.get("path"));
        const written = files.map(({ path, data }) => {
          const target = homePath(box, path);
          mkdirSync(dirname(target), { recursive: true });
          writeFileSync(target, data);
          const home = fileUser === "root" ? "/root" : "/home/user";
          const shown = path.startsWith("/") ? path : `${home}/${path}`;
          return { name: shown.split("/").at(-1) ?? "", path: shown, type: "file" as const };
        });
        return json(200, written);
      }
      return json(405, { code: 405, message: `${req.method} /files is not in envd's API` });
    }
    processes(call, box);
  };
}
