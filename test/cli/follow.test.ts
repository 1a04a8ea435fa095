import { createServer, type IncomingMessage, request, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";
import { configureNeonForNode, nodeDb } from "../../scripts/lib/neon-node";
import { randomId } from "../../src/crypto/api-keys";
import { runs } from "../../src/db/schema";
import { addEvent, recordTransition } from "../../src/runs/service";
import { until } from "../until";
import { apiUrl, cli, configHome, newUser } from "./harness";

// `benchwright runs follow` against the real API (wrangler dev) through a loopback proxy that
// breaks the way networks and busy APIs do: it cuts the first event stream mid-frame-run, then
// answers the reconnects with a 429 (Retry-After: 1) and a 503, and the final read of the run
// with a 502. The run's events are written while the CLI follows, with the code the coordinator
// uses; the run itself is a row (no compute backend in this suite).

type Db = ReturnType<typeof nodeDb>["db"];
let db: Db;
let closeDb: () => Promise<void>;

beforeAll(() => {
  configureNeonForNode(inject("databaseWsProxy"));
  const made = nodeDb(inject("databaseUrl"));
  db = made.db;
  closeDb = () => made.pool.end();
});
afterAll(() => closeDb());

interface Seen {
  path: string;
  at: number;
  lastEventId: string | null;
  answer: string;
}

/** The faulty path between the CLI and the API. */
async function faultyProxy() {
  const upstream = new URL(apiUrl());
  const seen: Seen[] = [];
  let streams = 0;
  let runReads = 0;
  let cut = () => {};
  const cutDone = new Promise<void>((resolve) => {
    cut = resolve;
  });
  const refuse = (
    res: ServerResponse,
    status: number,
    code: string,
    headers: Record<string, string> = {},
  ) => {
    res.writeHead(status, { "content-type": "application/problem+json", ...headers });
    res.end(JSON.stringify({ type: "about:blank", title: code, status, detail: "injected", code }));
  };
  const forward = (req: IncomingMessage, res: ServerResponse, cutAfterFrames?: number) => {
    const up = request(
      {
        host: upstream.hostname,
        port: upstream.port,
        path: req.url,
        method: req.method,
        headers: req.headers,
      },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        if (cutAfterFrames === undefined) return void answer.pipe(res);
        // Pass whole frames until `cutAfterFrames` events went through, then drop the connection.
        let text = "";
        let passed = 0;
        answer.on("data", (chunk: Buffer) => {
          text += chunk.toString("utf8");
          while (passed < cutAfterFrames) {
            const end = text.indexOf("\n\n");
            if (end < 0) return;
            const frame = text.slice(0, end + 2);
            text = text.slice(end + 2);
            if (!frame.startsWith("id: ") || ++passed < cutAfterFrames) {
              res.write(frame);
              continue;
            }
            // Cut once the last frame has left this process, so that the CLI has read it.
            res.write(frame, () => {
              up.destroy();
              res.socket?.destroy();
              cut();
            });
          }
        });
      },
    );
    up.on("error", () => res.socket?.destroy());
    req.pipe(up);
  };
  const server = createServer((req, res) => {
    const path = new URL(req.url ?? "/", "http://x").pathname;
    const lastEventId = (req.headers["last-event-id"] as string | undefined) ?? null;
    const log = (answer: string) => seen.push({ path, at: Date.now(), lastEventId, answer });
    let answer = "forwarded";
    if (path.endsWith("/events")) answer = ["cut", "429", "503"][streams++] ?? answer;
    else if (/^\/v1\/runs\/[^/]+$/.test(path) && ++runReads === 1) answer = "502";
    log(answer);
    if (answer === "cut") forward(req, res, 2);
    else if (answer === "429") refuse(res, 429, "rate_limited", { "retry-after": "1" });
    else if (answer === "503") refuse(res, 503, "database_unavailable");
    else if (answer === "502") refuse(res, 502, "bad_gateway");
    else forward(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    seen,
    cutDone,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

async function newRunningRun(user: { userId: string; environmentId: string }) {
  const id = randomId("run_");
  await db.insert(runs).values({
    id,
    userId: user.userId,
    environmentId: user.environmentId,
    status: "running",
    spec: { commands: ["true"] } as never,
    backend: "local",
  });
  return id;
}

const output = (runId: string, n: number) =>
  addEvent(db, runId, `out:${n}`, "output", { stream: "stdout", text: `line ${n}\n` });

describe("runs follow", () => {
  // case O1
  it("survives a dropped connection, a 429 and a 5xx mid-run, loses and repeats nothing, exits with the outcome", async () => {
    const proxy = await faultyProxy();
    try {
      const user = await newUser();
      const home = configHome();
      const login = await cli(["login", "--url", proxy.url], { home, input: `${user.key}\n` });
      expect(login.code, login.stderr).toBe(0);
      const runId = await newRunningRun(user);
      for (let n = 1; n <= 3; n++) await output(runId, n);

      const followed = cli(["runs", "follow", runId], { home });
      // The first stream is cut after two events; what is written while the CLI waits out the
      // 429 and the 503 comes on the stream it gets after them, and so does what comes later.
      await proxy.cutDone;
      for (let n = 4; n <= 6; n++) await output(runId, n);
      await until(
        "the CLI back on a stream",
        () => proxy.seen.filter((s) => s.path.endsWith("/events")).length >= 4,
        60_000,
      );
      await output(runId, 7);
      await recordTransition(db, runId, { to: "finished", reason: "completed" });
      const res = await followed;

      expect(res.code, res.stderr).toBe(0);
      const lines = res.stdout.split("\n").filter((l) => l.startsWith("  line "));
      expect(lines).toEqual([1, 2, 3, 4, 5, 6, 7].map((n) => `  line ${n}`));
      expect(res.stdout).toContain("· finished (completed)");
      expect(res.stdout).toContain(`${runId} finished: completed`);
      expect(res.stderr).toContain("HTTP 429 rate_limited; trying again in 1 s");
      expect(res.stderr).toContain("HTTP 503");
      expect(res.stderr).toContain("HTTP 502");

      const streams = proxy.seen.filter((s) => s.path.endsWith("/events"));
      expect(streams.slice(0, 4).map((s) => s.answer)).toEqual(["cut", "429", "503", "forwarded"]);
      // Every reconnect resumes from the second event, the last one that got through.
      expect(streams[0]?.lastEventId).toBeNull();
      const resumeAt = streams[1]?.lastEventId;
      expect(resumeAt).toBeTruthy();
      expect(streams.slice(1, 4).every((s) => s.lastEventId === resumeAt)).toBe(true);
      // The 429's Retry-After was waited (a lower bound only: this machine may be slow).
      expect((streams[2]?.at ?? 0) - (streams[1]?.at ?? 0)).toBeGreaterThanOrEqual(900);
    } finally {
      await proxy.close();
    }
  }, 120_000); // the waits it asks for (about 8 s), on a machine that may be busy

  it("--json streams NDJSON: each event once, then the run; a run that did not complete exits 4", async () => {
    const user = await newUser();
    const home = configHome();
    expect((await cli(["login", "--url", apiUrl()], { home, input: `${user.key}\n` })).code).toBe(0);
    const runId = await newRunningRun(user);
    for (let n = 1; n <= 3; n++) await output(runId, n);
    await recordTransition(db, runId, { to: "failed", reason: "command_failed" });
    const res = await cli(["runs", "follow", "--json", runId], { home });
    expect(res.code, res.stderr).toBe(4);
    const lines = res.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(lines.slice(0, -1).map((l) => l.event.detail?.text ?? l.event.state)).toEqual([
      "line 1\n",
      "line 2\n",
      "line 3\n",
      "failed",
    ]);
    expect(lines.at(-1).run).toMatchObject({ id: runId, status: "failed", reason: "command_failed" });
  });
});
