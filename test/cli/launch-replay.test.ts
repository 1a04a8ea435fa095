import { createServer, type IncomingMessage, request, type Server } from "node:http";
import { afterEach, describe, expect, it } from "vitest";
import { api, apiUrl, cli, configHome, newUser } from "./harness";

// Case L5 for the CLI: a launch whose answer is lost is retried with the same Idempotency-Key,
// and the replay leaves out the egress agent's token (the API keeps no copy of it). The CLI then
// asks for a new token, so the user still gets a command that works, and there is one run.
// The loss is real: a loopback relay in front of the API reads the first launch's answer and
// then drops the connection instead of passing it on.

interface Seen {
  method: string;
  path: string;
  key: string | undefined;
  /** The API's answer, whether or not it was passed on. */
  status?: number;
}

/** A relay to the API that swallows the answer to the first POST /v1/runs. */
async function lossyRelay(): Promise<{ url: string; seen: Seen[]; server: Server }> {
  const upstream = new URL(apiUrl());
  const seen: Seen[] = [];
  let dropped = false;
  const server = createServer((req, res) => {
    const path = req.url ?? "/";
    const entry: Seen = {
      method: req.method ?? "",
      path,
      key: req.headers["idempotency-key"] as string | undefined,
    };
    seen.push(entry);
    const drop = !dropped && req.method === "POST" && path === "/v1/runs";
    if (drop) dropped = true;
    const out = request(
      { host: upstream.hostname, port: upstream.port, path, method: req.method, headers: req.headers },
      (answer: IncomingMessage) => {
        entry.status = answer.statusCode;
        if (drop) {
          // The API did the work and answered; the client never hears it.
          answer.resume();
          answer.on("end", () => req.socket.destroy());
          return;
        }
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    out.on("error", () => req.socket.destroy());
    req.pipe(out);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  return { url: `http://127.0.0.1:${port}`, seen, server };
}

let relay: Server | undefined;
afterEach(() => {
  relay?.close();
  relay?.closeAllConnections();
});

describe("case L5: a lost launch answer and the CLI", () => {
  it("case L5: the retried launch is replayed without the agent token; the CLI asks for a new one; one run", async () => {
    const user = await newUser();
    const lossy = await lossyRelay();
    relay = lossy.server;
    const home = configHome();
    const login = await cli(["login", "--url", lossy.url], { home, input: `${user.key}\n` });
    expect(login.code, login.stderr).toBe(0);

    const launched = await cli(["runs", "launch", "--egress", "local", "--", "true"], { home });
    expect(launched.code, launched.stderr).toBe(0);
    const launches = lossy.seen.filter((s) => s.method === "POST" && s.path === "/v1/runs");
    // Sent twice with one key: the first answer was lost, the second is its replay.
    expect(launches).toHaveLength(2);
    expect(launches[0]?.key).toBeTruthy();
    expect(launches[1]?.key).toBe(launches[0]?.key);
    // The first answer was made (and lost), the second is its replay: one run.
    expect(launches.map((l) => l.status)).toEqual([202, 202]);
    const id = /run_[0-9a-z]+/.exec(launched.stdout)?.[0] ?? "";
    const asked = lossy.seen.filter((s) => s.path === `/v1/runs/${id}/egress-agent-token`);
    expect(asked).toHaveLength(1);
    const token = /BENCHWRIGHT_EGRESS_TOKEN=(bwe_[A-Za-z0-9_-]{43}) /.exec(launched.stdout)?.[1];
    if (asked[0]?.status === 201) {
      // The token printed is the run's live one (it replaced the lost one).
      expect(token, launched.stdout).toBeTruthy();
      const policy = await fetch(`${apiUrl()}/egress-agent/policy`, {
        headers: { authorization: `Bearer ${token}` },
      });
      expect(policy.status).toBe(200);
      expect(((await policy.json()) as { runId: string }).runId).toBe(id);
    } else {
      // This suite's stack has no compute backend, so the run may have failed within the retry's
      // second: then it needs no agent, and the CLI prints none and goes on.
      expect(asked[0]?.status).toBe(409);
      expect(token).toBeUndefined();
      expect(launched.stdout).toContain(id);
    }
    const runs = JSON.parse((await api(user.key, "/v1/runs")).text) as { runs: { id: string }[] };
    expect(runs.runs.map((r) => r.id)).toEqual([id]);
    await cli(["runs", "cancel", id], { home });
  });
});
