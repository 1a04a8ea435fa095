import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect, it } from "vitest";
import { nftFailingCatchAll } from "../local/harness";
import { demoVault, describeE2e, type E2eOptions, newUser, stdoutOf, waitForEnd } from "./harness";

// case E2 on real parts: the host agent's nft fails exactly on the catch-all rules (an injected
// fault in the redirect command), so a catch-all run cannot be put inside its boundary. It must
// stop before any benchmark command, with the reason and a warning, and leave no sandbox.

let dir: string;

async function start(): Promise<E2eOptions> {
  dir = mkdtempSync(join(tmpdir(), "bw-e2e-nft-"));
  const nft = nftFailingCatchAll(dir);
  return { name: "bwt-e2f", index: 92, nft };
}

const after = () => rmSync(dir, { recursive: true, force: true });

describeE2e("a catch-all redirect that cannot be installed (E2)", { start, after }, (e) => {
  it("stops the run before any command, with the reason, and tears down what was made", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary, { default: "block" });
    const launched = await api.call("POST", "/v1/runs", { commands: ["echo must-not-run"] });
    const run = await waitForEnd(api, launched.json.id);
    expect(run, JSON.stringify(run.trace, null, 1)).toMatchObject({
      status: "stopped",
      reason: "redirect_not_installed",
      routing: "catch-all",
    });
    expect(run.reasonDetail).toContain("injected nft failure");
    expect(run.notes).toContainEqual(
      expect.objectContaining({ level: "warning", code: "redirect_not_installed" }),
    );
    expect(stdoutOf(run)).toBe("");
    expect(run.trace.some((t: { state: string | null }) => t.state === "running")).toBe(false);
    expect(
      run.sandboxes.every((s: { status: string }) => s.status !== "ready" && s.status !== "creating"),
    ).toBe(true);
    const left = await fetch(`${e.stack.agent.url}/v1/sandboxes?runId=${run.id}`, {
      headers: { authorization: `Bearer ${e.stack.agentSecret}` },
    });
    expect(((await left.json()) as { sandboxes: unknown[] }).sandboxes).toEqual([]);
  });

  it("the same machine still runs a default-routing run (the fault is the catch-all redirect only)", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    const launched = await api.call("POST", "/v1/runs", { commands: ["echo fine"] });
    const run = await waitForEnd(api, launched.json.id);
    expect(run).toMatchObject({ status: "finished", reason: "completed", routing: "default" });
    expect(stdoutOf(run)).toContain("fine");
  });
});
