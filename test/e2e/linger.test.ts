import { ProxyView } from "@benchwright/shared/contract/proxy-view";
import { expect, it } from "vitest";
import { until } from "../until";
import { type Api, CLIENT_HELPERS, demoVault, describeE2e, newUser, nodeScript, waitForEnd } from "./harness";

// A lingering proxy on real parts: the run's commands end, its work sandbox goes, its proxy
// sandbox stays with the run's credentials; the user reads the proxy's own view through the
// control plane; nobody looking for LINGER_IDLE_SECONDS pauses it (SIGSTOP of the sandbox), the
// next look resumes it and gets an answer; a window shortened to 0 ends it (linger_lapsed) and
// tears the proxy down. Waits are polls with deadlines on the run's state, never timed sleeps.
// The pause/resume/reap timing itself is proved with the clock advanced in
// test/unit/run-machine.test.ts.

const IDLE_SECONDS = 2;

const runOf = async (api: Api, id: string) => (await api.call("GET", `/v1/runs/${id}`)).json;

const LINGERING = { name: "bwt-e2l", index: 95, workerVars: { LINGER_IDLE_SECONDS: String(IDLE_SECONDS) } };

describeE2e("a lingering proxy", { start: LINGERING }, (e) => {
  it("keeps only the proxy after the commands end, shows its view, pauses when idle, resumes on a look, and lapses", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    const script = `${CLIENT_HELPERS}
(async () => {
  const api = await get("https://api.demo.test/v1/whoami");
  const blocked = await get("https://blocked.demo.test/");
  console.log(JSON.stringify({ api: api.status, blocked: blocked.status }));
})();`;
    const launched = await api.call("POST", "/v1/runs", {
      commands: [nodeScript(script)],
      lingerSeconds: 3600,
    });
    expect(launched.status).toBe(202);
    const id = launched.json.id as string;

    const lingering = await until(
      "lingering",
      async () => {
        const run = await runOf(api, id);
        if (["finished", "stopped", "failed"].includes(run.status))
          throw new Error(JSON.stringify(run.trace));
        return run.status === "lingering" ? run : null;
      },
      60_000,
    );
    expect(lingering.reason).toBeNull();
    expect(lingering.linger.seconds).toBe(3600);
    expect(Date.parse(lingering.linger.until)).toBeGreaterThan(Date.now() + 3_000_000);
    const byKind = (run: { sandboxes: { kind: string; status: string }[] }, kind: string) =>
      run.sandboxes.filter((s) => s.kind === kind).map((s) => s.status);
    expect(byKind(lingering, "work")).toEqual(["destroyed"]);
    expect(byKind(lingering, "proxy")).toEqual(["ready"]);
    expect(lingering.trace.filter((t: { kind: string }) => t.kind === "transition").at(-1)).toMatchObject({
      state: "lingering",
      reason: "completed",
    });

    // The proxy's own view, through the control plane: what the run did, and no secret.
    const look = await api.call("GET", `/v1/runs/${id}/proxy`);
    expect(look.status, look.text).toBe(200);
    const view = ProxyView.parse(look.json.view);
    expect(view.runId).toBe(id);
    // (The wiring step's own probe is in the view too: only the benchmark's hosts are counted here.)
    const seen = view.recent
      .filter((d) => d.host?.endsWith(".demo.test"))
      .map((d) => [d.host, d.decision, d.rule !== null]);
    expect(seen).toEqual([
      ["api.demo.test", "allow", true],
      ["blocked.demo.test", "block", false],
    ]);
    expect(view.counts.injected).toBe(1);
    expect(look.text).not.toContain(e.canary);

    // The sweeper runs meanwhile: a live linger is not its business.
    const swept = await fetch(`${e.stack.apiUrl}/__scheduled?cron=${encodeURIComponent("*/5 * * * *")}`);
    expect(swept.status).toBe(200);
    expect((await runOf(api, id)).status).toBe("lingering");
    expect(byKind(await runOf(api, id), "proxy")).toEqual(["ready"]);

    // Nobody looks: the coordinator pauses it. The next look resumes it, and it answers.
    await until("paused", async () => ((await runOf(api, id)).linger.paused ? true : null), 30_000);
    const again = await api.call("GET", `/v1/runs/${id}/proxy`);
    expect(again.status, again.text).toBe(200);
    expect(again.json.resumed).toBe(true);
    expect(ProxyView.parse(again.json.view).counts.requests).toBe(view.counts.requests);
    expect((await runOf(api, id)).linger.paused).toBe(false);

    // The window shortened to nothing: the linger ends, the proxy goes, the reason says why.
    expectStatus(await api.call("POST", `/v1/runs/${id}/linger`, { seconds: 0 }), 202);
    const ended = await waitForEnd(api, id);
    expect(ended).toMatchObject({ status: "finished", reason: "linger_lapsed" });
    expect(ended.reasonDetail).toContain("completed");
    expect(byKind(ended, "proxy")).toEqual(["destroyed"]);
    const kinds = ended.trace
      .filter((t: { kind: string }) => t.kind === "note")
      .map((t: { detail: { lingerPaused?: boolean } }) => t.detail.lingerPaused);
    expect(kinds).toEqual(expect.arrayContaining([true, false]));
    const gone = await api.call("GET", `/v1/runs/${id}/proxy`);
    expect(gone.json.code).toBe("proxy_gone");
    expect(JSON.stringify(ended)).not.toContain(e.canary);
  });

  it("a run asked to linger that is cancelled while running does not linger", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    const id = (await api.call("POST", "/v1/runs", { commands: ["sleep 30"], lingerSeconds: 600 })).json.id;
    await until("running", async () => ((await runOf(api, id)).status === "running" ? true : null), 60_000);
    await api.call("POST", `/v1/runs/${id}/cancel`);
    const ended = await waitForEnd(api, id);
    expect(ended).toMatchObject({ status: "stopped", reason: "cancelled" });
    expect(ended.trace.some((t: { state: string | null }) => t.state === "lingering")).toBe(false);
    expect(ended.sandboxes.every((s: { status: string }) => s.status === "destroyed")).toBe(true);
  });
});

describeE2e("the sweeper and the backend", { start: { name: "bwt-e2s", index: 96 } }, (e) => {
  it("destroys a backend sandbox that no record owns", async () => {
    const agent = (path: string, init: RequestInit = {}) =>
      fetch(`${e.stack.agent.url}${path}`, {
        ...init,
        headers: { authorization: `Bearer ${e.stack.agentSecret}`, "content-type": "application/json" },
      });
    // A sandbox the broker never recorded (as if its run had been deleted with its user).
    const made = await agent("/v1/sandboxes", {
      method: "POST",
      body: JSON.stringify({ kind: "proxy", id: "sbx_unowned_e2e", runId: "run_deleted_e2e" }),
    });
    expect(made.status, await made.clone().text()).toBeLessThan(300);
    const listed = async () =>
      ((await (await agent("/v1/sandboxes")).json()) as { sandboxes: { id: string }[] }).sandboxes.map(
        (x) => x.id,
      );
    expect(await listed()).toContain("sbx_unowned_e2e");
    const swept = await fetch(`${e.stack.apiUrl}/__scheduled?cron=${encodeURIComponent("*/5 * * * *")}`);
    expect(swept.status).toBe(200);
    await until("swept", async () => ((await listed()).includes("sbx_unowned_e2e") ? null : true), 30_000);
  });
});

function expectStatus(res: { status: number; text: string }, status: number) {
  expect(res.status, res.text).toBe(status);
}
