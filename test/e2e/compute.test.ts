import { expect, it } from "vitest";
import {
  type Api,
  CLIENT_HELPERS,
  demoVault,
  describeE2e,
  lastJson,
  newUser,
  nodeScript,
  waitForEnd,
} from "./harness";

// Compute control on real parts (issue 7): a Harbor-style orchestrator sandbox asks for a task
// environment through the compute lane of its run's proxy with the run's capability, waits for it
// to be wired, runs commands in it, and deletes it; the environment's traffic goes through the
// same proxy (its credential injected, its blocked host refused) and it never holds a capability.
// A plain fan-out run shows the same for spec'd tasks: work has a capability, tasks none, and a
// task's sandbox is gone once its task is done.

const HARBOR_SCRIPT = `${CLIENT_HELPERS}
const base = process.env.BW_COMPUTE_URL;
const auth = { authorization: "Bearer " + process.env.BW_COMPUTE_TOKEN, "content-type": "application/json" };
const call = async (method, path, body) => {
  const res = await fetch(base + path, { method, headers: auth, body: body === undefined ? undefined : JSON.stringify(body) });
  return { status: res.status, body: await res.json().catch(() => null) };
};
const until = async (what, fn) => {
  const deadline = Date.now() + 60000;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error("timed out: " + what);
    await new Promise((r) => setTimeout(r, 200));
  }
};
const run = async (id, execId, argv) => {
  const started = await call("POST", "/environments/" + id + "/exec", { id: execId, argv });
  if (started.status !== 202) return { error: started };
  return until("exec " + execId, async () => {
    const e = await call("GET", "/environments/" + id + "/exec/" + execId);
    return e.body && e.body.state === "exited" ? e.body : null;
  });
};
(async () => {
  const me = await call("GET", "/capability");
  const made = await call("POST", "/environments", { name: "task-a" });
  const id = made.body.id;
  const ready = await until("ready", async () => {
    const e = await call("GET", "/environments/" + id);
    return e.body && e.body.state !== "preparing" ? e.body : null;
  });
  const hello = await run(id, "hello", ["sh", "-c", "echo hello-from-env; env | grep -c '^BW_COMPUTE' || true"]);
  const probe = await run(id, "net", ["node", "-e", ${JSON.stringify(`${CLIENT_HELPERS}
(async () => {
  const api = await get("https://api.demo.test/v1/whoami");
  const blocked = await get("https://blocked.demo.test/");
  console.log(JSON.stringify({ api: api.status, keyMatches: api.body && api.body.keyMatches, blocked: blocked.status }));
})();`)}]);
  const deleted = await call("DELETE", "/environments/" + id);
  const late = await call("POST", "/environments/" + id + "/exec", { id: "late", argv: ["true"] });
  const after = { status: late.status, code: late.body && late.body.code };
  console.log(JSON.stringify({
    runId: me.body.runId, made: made.status, ready: ready.state, hello: hello.stdout, helloExit: hello.exitCode,
    net: JSON.parse(probe.stdout.trim().split("\\n").pop()), deleted: deleted.body.state, after,
  }));
})().catch((e) => { console.log(JSON.stringify({ error: String(e) })); process.exit(1); });
`;

describeE2e("compute control from inside a run", { start: { name: "bwt-e2c", index: 98 } }, (e) => {
  it("gives a Harbor orchestrator a task environment through its proxy: wired, filtered, no capability, deleted", async () => {
    const api: Api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    const launched = await api.call("POST", "/v1/runs", {
      orchestrator: "harbor",
      commands: [nodeScript(HARBOR_SCRIPT)],
    });
    expect(launched.status).toBe(202);
    const run = await waitForEnd(api, launched.json.id);
    const out = lastJson(run, "orchestrator");
    expect(out.error).toBeUndefined();
    expect(run.status).toBe("finished");
    expect(out.runId).toBe(launched.json.id);
    expect(out.made).toBe(202);
    expect(out.ready).toBe("ready");
    expect(out.helloExit).toBe(0);
    // The environment ran the command, and holds no capability nor the compute URL.
    expect(out.hello).toBe("hello-from-env\n0\n");
    // Its traffic goes through the run's proxy: the credential is injected, the block holds.
    expect(out.net).toEqual({ api: 200, keyMatches: true, blocked: 403 });
    expect(out.deleted).toBe("deleted");
    // Deleted is deleted: nothing starts in it again.
    expect(out.after).toEqual({ status: 409, code: "environment_conflict" });
    const kinds = run.sandboxes.map((s: { kind: string; status: string }) => `${s.kind}:${s.status}`).sort();
    expect(kinds).toEqual(["orchestrator:destroyed", "proxy:destroyed", "task:destroyed"]);
    expect(JSON.stringify(run)).not.toContain(e.canary);
    expect(JSON.stringify(run)).not.toMatch(/bwc_[A-Za-z0-9_-]{43}/);
  });

  it("gives the work sandbox a capability and the tasks none; a task's sandbox goes when it is done", async () => {
    const api: Api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    const count = "echo compute=$(env | grep -c '^BW_COMPUTE_TOKEN=bwc_' || true)";
    const launched = await api.call("POST", "/v1/runs", {
      commands: [count],
      tasks: [{ name: "t1", commands: [count] }],
    });
    const run = await waitForEnd(api, launched.json.id);
    expect(run.status).toBe("finished");
    const printed = (name: string) =>
      run.trace
        .filter(
          (t: { kind: string; detail: { name?: string; stream?: string } }) =>
            t.kind === "output" && t.detail?.name === name && t.detail?.stream === "stdout",
        )
        .map((t: { detail: { text: string } }) => t.detail.text)
        .join("");
    expect(printed("work")).toBe("compute=1\n");
    expect(printed("t1")).toBe("compute=0\n");
  });
});
