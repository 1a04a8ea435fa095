import { mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { SandboxInfo } from "@benchwright/shared/contract/local-agent";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOTFS_UID_BASE } from "../../local-agent/rootfs";
import { type RunningAgent, startAgent } from "../../local-agent/server";
import { whyNot } from "./agent-suite";
import { AgentClient, ensureWorkImageBuilt, host, leftovers, nftFailingCatchAll, secret } from "./harness";

// The agent on a machine where something is wrong: nftables unusable, the work image not built,
// a redirect that cannot be installed (E2), a crashed agent's leftovers; each agent of its own.
// Apart: these start agents of their own, not the agent-*.test.ts suite's.

describe.skipIf(whyNot !== null)("local agent: faults fail closed", () => {
  const FAULT_UIDS: [number, number] = [330_000, 330_400];
  const dirs: string[] = [];
  const tempDir = () => {
    const d = mkdtempSync(join(tmpdir(), "bw-agent-fault-"));
    dirs.push(d);
    return d;
  };
  beforeAll(() => ensureWorkImageBuilt(), 300_000);

  /** Runs `body` with agents it starts, then closes them (in the order started). */
  async function withAgents(
    body: (
      start: (o: {
        nft?: string;
        stateDir?: string;
        uidBase: number;
        workImage?: string;
      }) => Promise<AgentClient>,
    ) => Promise<void>,
  ) {
    const agents: RunningAgent[] = [];
    try {
      await body(async (o) => {
        const s = secret();
        const a = await startAgent({
          secret: s,
          port: 0,
          controlPlane: "http://127.0.0.1:9",
          nft: o.nft,
          workImage: o.workImage,
          stateDir: o.stateDir ?? tempDir(),
          uidBase: o.uidBase,
          log: () => {},
          proxyTestEnv: { BW_TEST_ALLOW_CIDRS: "10.240.0.0/30" },
        });
        agents.push(a);
        return new AgentClient(a.url, s);
      });
    } finally {
      for (const a of agents) await a.close();
    }
  }

  afterAll(async () => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
    expect(await leftovers(FAULT_UIDS)).toEqual([]);
  });

  it("refuses every sandbox with cannot_isolate when nftables is unusable", async () => {
    await withAgents(async (start) => {
      const api = await start({ nft: "/bin/false", uidBase: FAULT_UIDS[0] });
      const health = (await api.call("GET", "/v1/health")).body;
      expect(health.ok).toBe(false);
      expect(health.problems?.join("\n")).toMatch(/nftables is unusable/);
      const res = await api.call("POST", "/v1/sandboxes", { kind: "proxy", id: "p", runId: "r" });
      expect([res.status, res.body.code]).toEqual([503, "cannot_isolate"]);
      expect(res.body.detail).toMatch(/nftables is unusable/);
      expect(await leftovers(FAULT_UIDS)).toEqual([]);
    });
  });

  it("refuses every sandbox with cannot_isolate when the work image is not built", async () => {
    await withAgents(async (start) => {
      const api = await start({ workImage: "localhost/benchwright-no-such-image", uidBase: FAULT_UIDS[0] });
      const health = (await api.call("GET", "/v1/health")).body;
      expect(health).toEqual({
        ok: false,
        problems: ["the work image (localhost/benchwright-no-such-image) is not built: run npm run images"],
        workImageId: null,
      });
      const res = await api.call("POST", "/v1/sandboxes", { kind: "proxy", id: "p", runId: "r" });
      expect([res.status, res.body.code]).toEqual([503, "cannot_isolate"]);
      expect(res.body.detail).toContain("run npm run images");
    });
  });

  it("exports the work image once per image id, and removes only exports no live agent uses", async () => {
    const root = tempDir();
    const [inUse, unused] = ["a", "b"].map((c) => c.repeat(64)) as [string, string];
    for (const id of [inUse, unused]) mkdirSync(join(root, id, "etc"), { recursive: true });
    writeFileSync(join(root, `.use-${inUse}-${process.pid}`), ""); // this process: alive
    writeFileSync(join(root, `.use-${unused}-999999999`), ""); // no such process
    const logged: Array<Record<string, unknown>> = [];
    const started = async () => {
      const s = secret();
      const a = await startAgent({
        secret: s,
        port: 0,
        controlPlane: "http://127.0.0.1:9",
        stateDir: tempDir(),
        rootfsDir: root,
        uidBase: FAULT_UIDS[0],
        log: (e) => logged.push(e),
      });
      await a.close();
    };
    await started();
    const exported = logged.filter((e) => e.event === "rootfs_exported");
    expect(exported).toHaveLength(1);
    const id = exported[0]?.imageId as string;
    expect(readdirSync(root).sort()).toEqual(
      [inUse, id, `.use-${inUse}-${process.pid}`, `.use-${id}-${process.pid}`].sort(),
    );
    // Files of the image's uid k belong to base+k; the export is root's only.
    expect(statSync(join(root, id, "etc", "hosts")).uid).toBe(ROOTFS_UID_BASE);
    expect(statSync(root).mode & 0o777).toBe(0o700);
    await started();
    expect(logged.filter((e) => e.event === "rootfs_exported")).toHaveLength(1); // cached
  }, 120_000);

  it("fails a catch-all sandbox whose redirect cannot be installed, leaving nothing of it (E2)", async () => {
    // Passes the health check and the proxy namespace's own rules; fails the catch-all rules.
    const nft = nftFailingCatchAll(tempDir());
    await withAgents(async (start) => {
      const api = await start({ nft, uidBase: FAULT_UIDS[0] });
      const px = await api.create({ kind: "proxy", id: "fp", runId: "fr" });
      const k = /^10\.231\.(\d+)\.2$/.exec(px.address)?.[1];
      const res = await api.call("POST", "/v1/sandboxes", {
        kind: "work",
        id: "fw",
        runId: "fr",
        proxySandboxId: "fp",
        routing: "catch-all",
      });
      expect([res.status, res.body.code]).toEqual([500, "sandbox_failed"]);
      expect(res.body.detail).toMatch(/^could not install the redirect: .*injected nft failure/);
      expect((await host(["ip", "netns", "list"])).stdout).not.toMatch(new RegExp(`^bw${k}w`, "m"));
      expect((await host(["ip", "-n", `bw${k}p`, "-br", "link"])).stdout).not.toContain(`bwp${k}w`);
      // The failed sandbox's uids (the block after the proxy's) run nothing.
      const processes = (await leftovers([FAULT_UIDS[0] + 2, FAULT_UIDS[0] + 4])).filter((l) =>
        l.startsWith("process"),
      );
      expect(processes).toEqual([]);
      const listed = (await api.call("GET", "/v1/sandboxes?runId=fr")).body.sandboxes;
      expect(listed?.map((s: SandboxInfo) => s.id)).toEqual(["fp"]);
      // Default routing needs no DNS redirect here, so the same agent still makes one.
      const ok = await api.create({
        kind: "work",
        id: "fd",
        runId: "fr",
        proxySandboxId: "fp",
        routing: "default",
      });
      expect(ok.state).toBe("ready");
    });
  });

  it("a new agent on the same state dir removes what a crashed one left", async () => {
    const stateDir = tempDir();
    await withAgents(async (start) => {
      const crashed = await start({ stateDir, uidBase: FAULT_UIDS[0] + 200 });
      const px = await crashed.create({ kind: "proxy", id: "cp", runId: "cr" });
      await crashed.serve("cp", "setInterval(() => {}, 1000); console.log('ready')");
      const k = /^10\.231\.(\d+)\.2$/.exec(px.address)?.[1];
      expect((await host(["ip", "netns", "list"])).stdout).toContain(`bw${k}p`);
      // The first agent never closes before the next one starts, as after a crash.
      await start({ stateDir, uidBase: FAULT_UIDS[0] + 300 });
      expect((await host(["ip", "netns", "list"])).stdout).not.toContain(`bw${k}p`);
      expect(await leftovers([FAULT_UIDS[0] + 200, FAULT_UIDS[0] + 300])).toEqual([]);
    });
  });
});
