import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildCli, cli as runCli } from "../cli/harness";

// `benchwright runs launch` and its Idempotency-Key (case K2, the CLI's side): every attempt of
// one launch carries the same key, so a retry after a lost answer is the same request to the API;
// another launch carries another key. The API here is a loopback server that fails on purpose.

const made: string[] = [];
let bin: string;
let server: Server;
let url: string;
let answers: ((res: ServerResponse) => void)[] = [];
const launches: IncomingMessage["headers"][] = [];

function json(res: ServerResponse, status: number, body: unknown) {
  res.writeHead(status, { "content-type": status < 300 ? "application/json" : "application/problem+json" });
  res.end(JSON.stringify(body));
}

const RUN = { id: "run_retry", status: "queued", backend: "local" };
const problem = (status: number, code: string) => (res: ServerResponse) =>
  json(res, status, { type: "about:blank", title: code, status, detail: code, code, requestId: "req_x" });

beforeAll(async () => {
  bin = await buildCli();
  server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      if (req.method === "POST" && req.url === "/v1/runs") {
        launches.push(req.headers);
        return (answers.shift() ?? ((r: ServerResponse) => json(r, 202, RUN)))(res);
      }
      json(res, 404, { code: "route_not_found", detail: "no" });
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await new Promise((r) => server?.close(r));
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

function cli(args: string[]) {
  const home = mkdtempSync(join(tmpdir(), "bw-cli-home-"));
  made.push(home);
  return runCli(args, { home, bin, env: { BENCHWRIGHT_API_KEY: "bw_test_retry_key", BENCHWRIGHT_URL: url } });
}

describe("runs launch: Idempotency-Key", () => {
  it("case K2: retries a launch answered 503, then in_use, with the same key; a new launch has a new key", async () => {
    launches.length = 0;
    answers = [problem(503, "database_unavailable"), problem(409, "idempotency_key_in_use")];
    const res = await cli(["runs", "launch", "--json", "--", "echo", "hi"]);
    expect(res.code, res.stderr).toBe(0);
    expect(JSON.parse(res.stdout).id).toBe(RUN.id);
    expect(launches).toHaveLength(3);
    const keys = launches.map((h) => h["idempotency-key"]);
    expect(keys[0]).toMatch(/^[\x20-\x7e]{1,255}$/);
    expect(new Set(keys).size).toBe(1);

    const next = await cli(["runs", "launch", "--json", "--", "echo", "hi"]);
    expect(next.code, next.stderr).toBe(0);
    expect(launches[3]?.["idempotency-key"]).not.toBe(keys[0]);
  }, 30_000);

  it("does not retry a refusal: a 409 reuse or a 400 is the answer", async () => {
    launches.length = 0;
    answers = [problem(409, "idempotency_key_reused")];
    const res = await cli(["runs", "launch", "--", "echo", "hi"]);
    expect(res.code).not.toBe(0);
    expect(res.stderr).toContain("idempotency_key_reused");
    expect(launches).toHaveLength(1);
  }, 30_000);
});
