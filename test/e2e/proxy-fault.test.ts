import { expect, it } from "vitest";
import {
  CLIENT_HELPERS,
  demoVault,
  describeE2e,
  lastJson,
  newUser,
  nodeScript,
  stdoutOf,
  waitForEnd,
} from "./harness";

// "Network the platform changed" when the proxy cannot be set up, on real parts: the host agent
// gives every proxy a setting it refuses to start with (an injected fault: the proxy exits with
// a configuration error before it listens). A run stops, with a warning that says why, unless
// it was launched with onProxyFailure "continue" under default routing: then it goes on, and
// the warning says its traffic left unfiltered. Never under catch-all.

const STACK = { name: "bwt-e2p", index: 93, proxyEnv: { BW_TEST_ROUTES: "not-a-route" } };

describeE2e("a proxy that cannot be set up", { start: STACK }, (e) => {
  it("stops the run before any command, with a warning and the reason", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    const launched = await api.call("POST", "/v1/runs", { commands: ["echo must-not-run"] });
    const run = await waitForEnd(api, launched.json.id);
    expect(run, JSON.stringify(run.trace, null, 1)).toMatchObject({
      status: "stopped",
      reason: "proxy_setup_failed",
    });
    expect(run.reasonDetail).toContain("BW_TEST_ROUTES");
    expect(run.notes).toContainEqual(expect.objectContaining({ level: "warning", code: "proxy_failed" }));
    expect(stdoutOf(run)).toBe("");
  });

  it("goes on unfiltered, and says so, when launched with onProxyFailure continue under default routing", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    const script = `${CLIENT_HELPERS}
(async () => console.log(JSON.stringify({ direct: await tcp("${e.upstream.address}", ${e.upstream.directPort}) })))();`;
    const launched = await api.call("POST", "/v1/runs", {
      commands: [nodeScript(script)],
      onProxyFailure: "continue",
    });
    const run = await waitForEnd(api, launched.json.id);
    expect(run, JSON.stringify(run.trace, null, 1)).toMatchObject({
      status: "finished",
      reason: "completed",
    });
    const warning = run.notes.find((n: { code: string }) => n.code === "proxy_failed_unfiltered");
    expect(warning).toMatchObject({ level: "warning" });
    expect(warning.text).toContain("UNFILTERED");
    expect(run.proof).toMatchObject({ enforced: false, reason: "proxy_failed_unfiltered" });
    // Unfiltered, as the warning says: the sandbox's connection went straight out.
    expect(lastJson(run).direct).toBe("connected");
    expect(e.upstream.seen.filter((s) => s.event === "direct")).toHaveLength(1);
  });

  it("never goes on under catch-all, even when asked to", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary, { default: "block" });
    const launched = await api.call("POST", "/v1/runs", {
      commands: ["echo must-not-run"],
      onProxyFailure: "continue",
    });
    const run = await waitForEnd(api, launched.json.id);
    expect(run).toMatchObject({ status: "stopped", reason: "proxy_setup_failed", routing: "catch-all" });
    expect(stdoutOf(run)).toBe("");
  });
});
