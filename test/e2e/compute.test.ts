import { expect, it } from "vitest";
import {
  type Api,
  CLIENT_HELPERS,
  demoVault,
  describeE2e,
  lastJson,
  newUser,
  nodeScript,
  type TraceEvent,
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

// Harbor's per-task prebuild (issue 34): the orchestrator asks for two environments with the same
// setup at once. The first runs the run's setup then its own and is kept as a setup image; the
// second waits for it and starts from it, without a setup stage.
const RUN_SETUP = "echo run-setup >> /opt/bw-order";
const ENV_SETUP = "echo env-setup-ran; echo env-setup >> /opt/bw-order";
const PREBUILD_SCRIPT = `${CLIENT_HELPERS}
const base = process.env.BW_COMPUTE_URL;
const auth = { authorization: "Bearer " + process.env.BW_COMPUTE_TOKEN, "content-type": "application/json" };
const call = async (method, path, body) => {
  const res = await fetch(base + path, { method, headers: auth, body: body === undefined ? undefined : JSON.stringify(body) });
  return { status: res.status, body: await res.json().catch(() => null) };
};
const until = async (what, fn) => {
  const deadline = Date.now() + 180000;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error("timed out: " + what);
    await new Promise((r) => setTimeout(r, 250));
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
  const made = [];
  for (const name of ["task-a", "task-b"]) {
    made.push(await call("POST", "/environments", { name, setup: [${JSON.stringify(ENV_SETUP)}] }));
  }
  const out = { made: made.map((m) => m.status), envs: {} };
  for (const m of made) {
    const view = await until("ready " + m.body.name, async () => {
      const e = await call("GET", "/environments/" + m.body.id);
      return e.body && e.body.state !== "preparing" ? e.body : null;
    });
    const order = await run(m.body.id, "order", ["cat", "/opt/bw-order"]);
    out.envs[m.body.name] = { view, order: order.stdout, uid: (await run(m.body.id, "uid", ["id", "-u"])).stdout };
    await call("DELETE", "/environments/" + m.body.id);
  }
  console.log(JSON.stringify(out));
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

  it("prebuilds a Harbor task's environment once: the second of the same setup starts from its image (cases P5, P6)", async () => {
    const api: Api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    const launched = await api.call("POST", "/v1/runs", {
      orchestrator: "harbor",
      setup: [RUN_SETUP],
      commands: [nodeScript(PREBUILD_SCRIPT)],
    });
    expect(launched.status).toBe(202);
    const run = await waitForEnd(api, launched.json.id, 300_000);
    const out = lastJson(run, "orchestrator");
    expect(out.error).toBeUndefined();
    expect(run.status).toBe("finished");
    expect(out.made).toEqual([202, 202]);
    const a = out.envs["task-a"];
    const b = out.envs["task-b"];
    // Each has the run's setup, then its own, once: the second has them from the image.
    expect(a.order).toBe("run-setup\nenv-setup\n");
    expect(b.order).toBe("run-setup\nenv-setup\n");
    expect(b.uid).not.toBe("0\n");
    expect(a.view.setupImage).toMatchObject({ digest: expect.stringMatching(/^sha256:[0-9a-f]{64}$/) });
    const image = { ...a.view.setupImage, builtBy: run.id, builtNow: true };
    expect(a.view.setupImage).toEqual(image);
    expect(b.view.setupImage).toEqual(image);

    // case P6: the setup ran once, in task-a, and one layer was captured for the two.
    const setupOutput = (name: string) =>
      run.trace.filter(
        (t: TraceEvent) => t.kind === "output" && t.detail?.stage === "setup" && t.detail?.name === name,
      );
    expect(setupOutput("task-a").map((t: TraceEvent) => t.detail.text)).toContain("env-setup-ran\n");
    expect(setupOutput("task-b")).toEqual([]);
    const captured = e.logs.filter(
      (l) => l.includes('"event":"layer_captured"') && l.includes(`"runId":"${run.id}"`),
    );
    // The orchestrator's own (the run's setup alone) and task-a's: never task-b's.
    expect(captured).toHaveLength(2);
    expect(captured.some((l) => l.includes(image.digest.slice("sha256:".length)))).toBe(true);
    const listed = await api.call("GET", "/v1/setup-images");
    expect(listed.json.setupImages.filter((i: { key: string }) => i.key === image.key)).toHaveLength(1);

    // case P5: task-b never ran the wiring program as its root; its one proof is the clean-root
    // re-proof from the execute stage, and it passed before the holder's first exec could start.
    const proofs = run.trace.filter((t: TraceEvent) => t.kind === "proxy" && t.detail?.name === "task-b");
    expect(proofs.map((t: TraceEvent) => [t.detail.installed, t.detail.proof.ok])).toEqual([[true, true]]);
    expect(
      run.trace.find((t: TraceEvent) => t.detail?.stage === "setup_image" && t.detail?.name === "task-b")
        ?.detail.text,
    ).toBe(`task-b starts from setup image ${image.digest}, built now: no setup stage.`);
    expect(JSON.stringify(run)).not.toContain(e.canary);
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
