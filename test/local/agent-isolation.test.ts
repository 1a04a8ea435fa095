import { existsSync, readlinkSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { SandboxInfo } from "@benchwright/shared/contract/local-agent";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOTFS_UID_BASE } from "../../local-agent/rootfs";
import { REPO_ROOT } from "../../local-agent/server";
import { type AgentSuite, startAgentSuite, UIDS, whyNot } from "./agent-suite";
import { type AgentClient, host, secret, until } from "./harness";

// What a sandbox's processes are and see: the execute stage's uid and capabilities, the host's
// checkout, processes, IPC and /tmp hidden, no user namespace of their own, no change to the
// network, and /etc/hosts writable by the setup stage only. Apart from the network's paths
// (agent-routing.test.ts) and the execs' API (agent-execs.test.ts).

const HOST_TMP_MARKER = `bw-host-tmp-${process.pid}`;

describe.skipIf(whyNot !== null)("local agent: sandboxes in namespaces", () => {
  let suite: AgentSuite;
  let api: AgentClient;
  let work: SandboxInfo; // default routing
  const marker = `bw-marker-${secret().slice(0, 12)}`;

  beforeAll(() => writeFileSync(join("/tmp", HOST_TMP_MARKER), "host"));
  beforeAll(async () => {
    suite = await startAgentSuite();
    ({ api, work } = suite);
  }, 300_000);

  afterAll(async () => {
    await suite?.close();
    rmSync(join("/tmp", HOST_TMP_MARKER), { force: true });
  }, 30_000);

  it("runs the execute stage as an unprivileged uid with no capabilities", async () => {
    // The sandbox's user namespace maps inner 0 (setup) to the owner of the work image's files,
    // inner 1 (execute) to the sandbox's own host uid U+1, and the image's other uids above base.
    const setup = await api.sh("wk1", "cat /proc/self/uid_map; id -u", "setup");
    const lines = setup.stdout.trim().split("\n");
    const map = lines.slice(0, 3).map((l) => l.trim().split(/\s+/).map(Number));
    expect(map[0]).toEqual([0, ROOTFS_UID_BASE, 1]);
    expect(map[1]?.[0]).toBe(1);
    expect(map[1]?.[1]).toBeGreaterThanOrEqual(UIDS[0]);
    expect(map[1]?.[2]).toBe(1);
    expect(map[2]).toEqual([2, ROOTFS_UID_BASE + 2, 65_534]);
    expect(lines[3]).toBe("0");
    const exec = await api.sh(
      "wk1",
      "id -u; grep -E '^(CapInh|CapEff|CapPrm|CapAmb|NoNewPrivs|Groups)' /proc/self/status; readlink /proc/self",
    );
    const [uid, ...rest] = exec.stdout.trim().split("\n");
    expect(Number(uid)).toBe(1); // host uid U+1: neither root nor the setup stage's uid
    const status = Object.fromEntries(rest.slice(0, 6).map((l) => l.split(/:\s*/) as [string, string]));
    for (const cap of ["CapInh", "CapPrm", "CapEff", "CapAmb"]) expect(status[cap], cap).toMatch(/^0{16}$/);
    expect(status.NoNewPrivs).toBe("1");
    expect(status.Groups).toBe(""); // no supplementary group
    // CapBnd is not asserted: entering a user namespace resets the bounding set, and nothing of the
    // sandbox may run privileged to drop it. No capability can be gained with no_new_privs.
    expect(rest[6]).toMatch(/^\d+$/); // /proc/self works: it is the sandbox's own PID namespace
  });

  it("hides the checkout (with its .data and any .dev.vars) from both stages", async () => {
    for (const stage of ["execute", "setup"] as const) {
      const res = await api.sh("wk1", `ls -A ${REPO_ROOT}; cat ${REPO_ROOT}/package.json; echo done`, stage);
      expect(res.stdout.trim(), stage).toBe("done");
      expect(res.stderr, stage).toContain("No such file");
    }
  });

  it("gives both stages the agent's own Node, read-only, for the image's programs", async () => {
    // The pinned Node 24 (under the hidden checkout) appears at /run/bw-node; no stage can change it.
    for (const stage of ["execute", "setup"] as const) {
      const res = await api.sh("wk1", "/run/bw-node --version; : > /run/bw-node && echo wrote", stage);
      expect(res.stdout.trim(), stage).toBe(process.version);
      expect(res.stderr, stage).toMatch(/Read-only file system|Permission denied/);
    }
  });

  it("lets no stage make a user namespace of its own (to shadow /etc/hosts there)", async () => {
    const shadow =
      "echo '10.0.0.9 api.example.test' > $HOME/hosts; unshare -Urm sh -c \"mount --bind $HOME/hosts /etc/hosts && cat /etc/hosts\"";
    for (const stage of ["execute", "setup"] as const) {
      const res = await api.sh("wk1", shadow, stage);
      expect(res.exitCode, stage).not.toBe(0);
      expect(res.stdout, stage).not.toContain("10.0.0.9");
      expect(res.stderr, stage).toMatch(/unshare failed/);
    }
    // The host's own limit is untouched: only the sandbox's namespace forbids more of them.
    expect(Number((await host(["cat", "/proc/sys/user/max_user_namespaces"])).stdout)).toBeGreaterThan(0);
  });

  it("lets the setup stage write /etc/hosts and the execute stage only read it", async () => {
    const write = await api.sh("wk1", `echo "${work.proxyAddress} api.example.test" >> /etc/hosts`, "setup");
    expect(write.exitCode).toBe(0);
    const denied = await api.sh("wk1", "echo '10.0.0.9 evil.test' >> /etc/hosts");
    expect(denied.exitCode).not.toBe(0);
    expect((await api.sh("wk1", "cat /etc/hosts")).stdout).toContain("api.example.test");
    expect((await api.sh("wk1", "cat /etc/hosts")).stdout).not.toContain("evil.test");
  });

  it("denies both stages any change to the sandbox's network", async () => {
    // SIOCSIFFLAGS on lo (what `ip link set lo down` does; the image has no iproute2).
    const down = `python3 -c "import fcntl, socket, struct; fcntl.ioctl(socket.socket(), 0x8914, struct.pack('16sH', b'lo', 0))"`;
    for (const stage of ["setup", "execute"] as const) {
      const r = await api.sh("wk1", down, stage);
      expect(r.exitCode, stage).not.toBe(0);
      expect(r.stderr).toMatch(/Operation not permitted/);
    }
    const mounts = await api.sh("wk1", "umount /tmp || umount /proc || mount -t tmpfs x /mnt", "setup");
    expect(mounts.exitCode).not.toBe(0);
  });

  it("hides the proxy sandbox's processes and the host's from a work sandbox", async () => {
    const started = await api.start("px1", {
      argv: ["node", "-e", "setInterval(() => {}, 1000)", marker],
      stage: "setup",
      timeoutMs: 60_000,
    });
    const cmdlines = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done";
    // The check can see a marker where there is one (once the started process runs).
    await until("the marker to run in the proxy sandbox", async () =>
      (await api.sh("px1", cmdlines, "setup")).stdout.includes(marker),
    );
    for (const stage of ["setup", "execute"] as const) {
      const seen = await api.sh("wk1", `${cmdlines}; ps -eo args`, stage);
      expect(seen.stdout).not.toContain(marker);
      expect(seen.stdout).not.toContain("vitest");
    }
    await api.call("POST", `/v1/sandboxes/px1/exec/${started.execId}/kill`);
  });

  it("gives each sandbox an IPC namespace of its own, the same in both stages", async () => {
    const ipc = async (id: string, stage: "setup" | "execute") =>
      (await api.sh(id, "readlink /proc/self/ns/ipc", stage)).stdout.trim();
    const [wkSetup, wkExec, tk, px] = await Promise.all([
      ipc("wk1", "setup"),
      ipc("wk1", "execute"),
      ipc("tk1", "execute"),
      ipc("px1", "setup"),
    ]);
    expect(wkSetup).toMatch(/^ipc:\[\d+\]$/);
    expect(wkExec).toBe(wkSetup);
    expect(new Set([readlinkSync("/proc/self/ns/ipc"), wkExec, tk, px]).size).toBe(4);
  });

  it("gives each sandbox a private, empty /tmp", async () => {
    expect((await api.sh("wk1", "ls -A /tmp")).stdout).toBe("");
    expect((await api.sh("wk1", `ls /tmp/${HOST_TMP_MARKER}`)).exitCode).not.toBe(0);
    expect((await api.sh("wk1", "echo mine > /tmp/private-file")).exitCode).toBe(0);
    expect((await api.sh("tk1", "ls -A /tmp")).stdout).toBe("");
    expect(existsSync("/tmp/private-file")).toBe(false);
    expect((await api.sh("wk1", "cat /tmp/private-file", "setup")).stdout).toBe("mine\n");
  });
});
