import { readdirSync, readFileSync } from "node:fs";
import { expect, it } from "vitest";
import { until } from "../until";
import { demoVault, describeE2e, newUser, waitForEnd } from "./harness";

// Fault injection on real parts: the run's proxy is killed (SIGKILL, as the OOM killer would)
// while its commands run. The run must fail closed and say so: it stops with proxy_lost, its
// commands end, every sandbox is removed, and the run page tells the user what happened.

/** The pids of the proxy process of one run: a `bw-proxy` exec, found by its run id. */
function proxyPids(runId: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const environ = readFileSync(`/proc/${entry}/environ`, "utf8").split("\0");
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, "utf8");
      if (environ.includes(`BW_RUN_ID=${runId}`) && environ.some((v) => v.startsWith("BW_PROXY_TOKEN="))) {
        if (/proxy/.test(cmdline)) pids.push(Number(entry));
      }
    } catch {} // gone meanwhile, or not ours to read
  }
  return pids;
}

describeE2e("the proxy dying mid-run", { start: { name: "bwt-e2k", index: 87 } }, (e) => {
  it("stops the run with proxy_lost, removes its sandboxes, and the page says why", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    const launched = await api.call("POST", "/v1/runs", {
      commands: ["echo started; while true; do sleep 1; done"],
    });
    expect(launched.status).toBe(202);
    const id = launched.json.id as string;
    await until(
      "the run's command to be running",
      async () => {
        const run = (await api.call("GET", `/v1/runs/${id}`)).json;
        if (["finished", "stopped", "failed"].includes(run.status))
          throw new Error(`ended early: ${run.reason}`);
        return run.status === "running" && JSON.stringify(run.trace).includes("started") ? run : null;
      },
      60_000,
      250,
    );
    const pids = proxyPids(id);
    expect(pids.length, "the run's proxy process").toBeGreaterThan(0);
    for (const pid of pids) process.kill(pid, "SIGKILL");

    const run = await waitForEnd(api, id, 60_000);
    expect(run).toMatchObject({ status: "stopped", reason: "proxy_lost" });
    expect(run.reasonDetail).toContain("SIGKILL");
    expect(run.notes).toContainEqual(expect.objectContaining({ level: "warning", code: "proxy_lost" }));
    expect(run.sandboxes.length).toBeGreaterThanOrEqual(2);
    expect(run.sandboxes.every((s: { status: string }) => s.status === "destroyed")).toBe(true);
    // Nothing of the run is left on the host: no process holds its run id any more.
    expect(proxyPids(id)).toEqual([]);

    // The page: log in with the key, read the run's page.
    const login = await fetch(`${e.stack.apiUrl}/login`, {
      method: "POST",
      body: new URLSearchParams({ key: api.key, next: `/runs/${id}` }),
      // What a browser sends for our own login form (K1: anything else is refused).
      headers: { origin: new URL(e.stack.apiUrl).origin, "sec-fetch-site": "same-origin" },
      redirect: "manual",
    });
    expect(login.status).toBe(303);
    const cookie = (login.headers.get("set-cookie") ?? "").split(";")[0] as string;
    const page = await fetch(`${e.stack.apiUrl}/runs/${id}`, { headers: { cookie } });
    expect(page.status).toBe(200);
    const html = await page.text();
    expect(html).toContain("proxy_lost");
    expect(html).toContain("The run&#39;s proxy stopped while the run was going");
    expect(html).not.toContain(e.canary);
  });
});
