import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PROBE_HEADER, WIRING_PROBE_HOST } from "@benchwright/shared/contract/proxy-wire";
import { type WiringInput, WiringProof } from "@benchwright/shared/contract/wiring";
import { filesFirst } from "@benchwright/shared/policy/hosts-file";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { detectCgroups } from "../../local-agent/cgroups";
import { IMAGE_MOUNT, NODE_MOUNT } from "../../local-agent/sandbox";
import { StateDir } from "../../local-agent/state-dir";
import { createTestCa, type TestCa } from "../../scripts/lib/test-ca";
import {
  type AgentClient,
  ensureWorkImageBuilt,
  host,
  leftovers,
  onPath,
  secret,
  startTestAgent,
  type TestAgent,
  until,
  whyNotRunnable,
} from "./harness";

// What the seal owns (cases L1, L2, L7), on real namespaces, cgroups and the real host agent: a
// setup stage that writes its own namespace limits back up, rewrites the name service's
// configuration, or leaves processes the kill rounds cannot empty. After a seal the execute
// stage must find the limits held, the wiring's files the agent's again and the run's redirect
// proved; or the seal refuses (`setup_not_sealed`) and nothing runs beside what setup left. And
// the re-proof after the seal is not the setup stage's to forge (G5): it runs in a clean root.

const whyNot = whyNotRunnable();
if (whyNot) console.warn(`seal suites skipped: ${whyNot} (they need root on Linux)`);

const UIDS: [number, number] = [350_000, 350_400];
const RUN = "run-l";
const HOSTS = ["api.example.test"];
const LIMITS = 'cd /proc/sys/user && for f in max_*; do echo "$f=$(cat $f)"; done';

// A library the setup stage preloads into every program of the sandbox (/etc/ld.so.preload):
// in one that runs the wiring program, it prints the proof kept in /etc/bw-lie.json and exits 0
// before node starts. What a setup stage that owns the sandbox's loader can make any proof say.
const LYING_PRELOAD = `#include <fcntl.h>
#include <string.h>
#include <unistd.h>
__attribute__((constructor)) static void lie(void) {
  static char cmd[8192], proof[65536];
  int fd = open("/proc/self/cmdline", O_RDONLY);
  if (fd < 0) return;
  ssize_t n = read(fd, cmd, sizeof cmd - 1);
  close(fd);
  if (n <= 0) return;
  for (ssize_t i = 0; i < n; i++) if (cmd[i] == 0) cmd[i] = ' ';
  cmd[n] = 0;
  if (!strstr(cmd, "wiring.cjs")) return;
  fd = open("/etc/bw-lie.json", O_RDONLY);
  n = fd < 0 ? 0 : read(fd, proof, sizeof proof);
  if (n > 0) write(1, proof, n);
  _exit(0);
}
`;

/** `name=value` lines as a map. */
const parse = (text: string) =>
  Object.fromEntries(
    text
      .trim()
      .split("\n")
      .map((l) => l.split("=") as [string, string]),
  );

describe.skipIf(whyNot !== null)("local agent: what the seal owns", () => {
  let testAgent: TestAgent;
  let api: AgentClient;
  let stateDir: string;
  let scratch: string;
  let ca: TestCa;
  const proxyAddress: Record<string, string> = {};

  async function work(id: string, extra: Record<string, unknown> = {}) {
    const info = await api.create({
      kind: "work",
      id,
      runId: RUN,
      proxySandboxId: "px",
      routing: "default",
      ...extra,
    });
    proxyAddress[id] = info.proxyAddress as string;
    return info;
  }

  const sealBody = { routing: "default", hostsFile: HOSTS };
  const seal = (id: string) =>
    api.call("POST", `/v1/sandboxes/${id}/seal`, { ...sealBody, caCertPem: ca.certPem });

  function wiringInput(id: string, extra: Partial<WiringInput> = {}): WiringInput {
    return {
      mode: "default",
      caCertPem: ca.certPem,
      proxyAddress: proxyAddress[id] as string,
      hostsFile: HOSTS,
      probe: { directTarget: null },
      ...extra,
    };
  }

  async function wiring(id: string, stage: "setup" | "execute", input: WiringInput) {
    const info = await api.run(id, { argv: ["bw-wiring"], stage, stdin: JSON.stringify(input) });
    return { info, proof: info.stdout ? WiringProof.parse(JSON.parse(info.stdout)) : null };
  }

  /** The sandbox's cgroup directory per hierarchy (as the agent names it). */
  function cgroupDirs(id: string): string[] {
    const cgroups = detectCgroups();
    if (!cgroups.ok) throw new Error(cgroups.problem);
    const tag = new StateDir(stateDir).tag;
    return [...new Set(Object.values(cgroups.host.parents))].map((p) => join(p, `${tag}-${id}`));
  }

  beforeAll(async () => {
    await ensureWorkImageBuilt();
    stateDir = mkdtempSync(join(tmpdir(), "bw-seal-test-"));
    scratch = mkdtempSync(join(tmpdir(), "bw-seal-scratch-"));
    ca = await createTestCa("Benchwright seal test run CA");
    testAgent = await startTestAgent({ secret: secret(), stateDir, uidBase: UIDS[0], log: () => {} });
    ({ api } = testAgent);
    await api.create({ kind: "proxy", id: "px", runId: RUN });
    // A stand-in for the proxy's TLS listener: the wiring probe's answer (403 with the probe
    // header, a certificate for the probe host from the "run CA").
    const leaf = await ca.issue([WIRING_PROBE_HOST]);
    await api.serve(
      "px",
      `const [key, cert] = JSON.parse(process.argv[1]);
       require("https").createServer({ key, cert }, (req, res) => {
         res.writeHead(403, { "${PROBE_HEADER}": "refused" }).end();
       }).listen(8443, () => console.log("ready"));`,
      "setup",
      [JSON.stringify([leaf.keyPem, leaf.certPem + ca.certPem])],
    );
  }, 300_000);

  afterAll(async () => {
    await testAgent?.close();
    for (const d of [stateDir, scratch]) if (d) rmSync(d, { recursive: true, force: true });
    expect(await leftovers(UIDS)).toEqual([]);
  }, 60_000);

  it("case L1: setup writes its namespace limits back up; after seal execute still makes no namespace", async () => {
    await work("l1");
    // The only /proc/sys files the setup stage may write are its own user namespace's limits:
    // the mount, PID, IPC and network namespaces (and the UTS one) are the host root's, so are
    // their sysctls. The execute stage may write none. Each file access(2) calls writable is
    // written its own value (kernel.ns_last_pid is 0666 and refuses in its handler).
    const writable = (stage: "setup" | "execute") =>
      api.sh(
        "l1",
        `for f in $(find /proc/sys -type f -writable 2>/dev/null | sort); do v=$(cat $f) && (printf '%s\\n' "$v" > $f) 2>/dev/null && echo $f; done`,
        stage,
      );
    const setupWritable = (await writable("setup")).stdout.trim().split("\n");
    expect(setupWritable).toContain("/proc/sys/user/max_user_namespaces");
    expect(setupWritable.filter((f) => !/^\/proc\/sys\/user\/max_[a-z_]+$/.test(f))).toEqual([]);
    expect((await writable("execute")).stdout).toBe("");

    // Made with every namespace count at 0 (the other limits as the kernel gave them).
    const made = parse((await api.sh("l1", LIMITS, "setup")).stdout);
    const counts = Object.keys(made).filter((k) => k.endsWith("_namespaces"));
    expect(counts).toEqual(
      expect.arrayContaining(["max_user_namespaces", "max_mnt_namespaces", "max_net_namespaces"]),
    );
    for (const k of counts) expect(made[k], k).toBe("0");

    // Setup's root raises all of them, and it works: setup can then make namespaces itself.
    const raise = await api.sh(
      "l1",
      "for f in /proc/sys/user/max_*; do echo 1000 > $f || exit 1; done; unshare -U true && unshare -m true && echo made",
      "setup",
    );
    expect(raise).toMatchObject({ exitCode: 0, stdout: "made\n" });
    expect(parse((await api.sh("l1", LIMITS, "setup")).stdout).max_user_namespaces).toBe("1000");

    expect((await seal("l1")).status).toBe(200);
    // Held again from the host side, read by the execute stage.
    expect(parse((await api.sh("l1", LIMITS)).stdout)).toEqual(made);
    for (const attempt of ["unshare -Urn true", "unshare -U true", "unshare -m true", "unshare -n true"]) {
      const res = await api.sh("l1", attempt);
      expect(res.exitCode, attempt).not.toBe(0);
      expect(res.stderr, attempt).toMatch(/unshare failed/);
    }
    // The host's own limit is untouched.
    expect(Number(readFileSync("/proc/sys/user/max_user_namespaces", "utf8"))).toBeGreaterThan(0);
  }, 180_000);

  it("case L2: setup rewrites /etc/nsswitch.conf; the seal puts the wiring's back, from outside, and the re-proof passes", async () => {
    await work("l2");
    const image = (await api.sh("l2", "cat /etc/nsswitch.conf")).stdout;
    expect(image).toMatch(/^hosts:/m);
    const first = await wiring("l2", "setup", wiringInput("l2"));
    expect(first.proof?.ok, first.info.stdout + first.info.stderr).toBe(true);

    // As an NSS package's postinst does (sed -i renames a new file over it): setup may.
    const sed = await api.sh(
      "l2",
      "sed -i 's/^hosts:.*/hosts: dns/' /etc/nsswitch.conf && grep '^hosts:' /etc/nsswitch.conf",
      "setup",
    );
    expect(sed).toMatchObject({ exitCode: 0, stdout: "hosts: dns\n" });
    // Before any seal the redirect is gone with it: the probe name no longer resolves.
    const broken = await wiring("l2", "execute", wiringInput("l2", { installed: true }));
    expect(broken.proof?.probes).toEqual([
      expect.objectContaining({
        name: "tls_probe",
        ok: false,
        observed: expect.stringMatching(/does not resolve/),
      }),
    ]);

    // Then the worst of it: the file a link to a host path (which the agent must never follow
    // from outside), and the directories above it made the execute stage's to rename in.
    const hostFile = join(scratch, "l2-host-file");
    writeFileSync(hostFile, "the host's own file\n");
    const plant = [
      `ln -sf ${hostFile} /etc/nsswitch.conf`,
      "chown 1:1 /etc && chmod 777 /etc /",
      "test -L /etc/nsswitch.conf && echo planted",
    ].join(" && ");
    expect((await api.sh("l2", plant, "setup")).stdout).toBe("planted\n");

    expect((await seal("l2")).status).toBe(200);
    expect(readFileSync(hostFile, "utf8")).toBe("the host's own file\n");
    const seen = await api.sh(
      "l2",
      "cat /etc/nsswitch.conf; echo ---; stat -c '%F %u %a' /etc/nsswitch.conf / /etc; getent hosts api.example.test",
    );
    const [nss, rest] = seen.stdout.split("---\n");
    expect(nss).toBe(filesFirst(image));
    expect(rest?.trim().split("\n")).toEqual([
      "regular file 65534 644", // the host's root's: writable by no one in the sandbox
      "directory 0 755",
      "directory 0 755",
      expect.stringMatching(
        new RegExp(`^${proxyAddress.l2?.replaceAll(".", "\\.")}\\s+api\\.example\\.test$`),
      ),
    ]);
    // The execute stage can neither replace it nor move a directory above it aside.
    const replace = await api.sh(
      "l2",
      "echo 'hosts: dns' > /tmp/n; mv -f /tmp/n /etc/nsswitch.conf; mv /etc /etc2; echo 'hosts: dns' >> /etc/nsswitch.conf",
    );
    expect(replace.stderr.match(/Permission denied/g)?.length).toBe(3);
    const proof = await wiring("l2", "execute", wiringInput("l2", { installed: true }));
    expect(proof.info.exitCode, proof.info.stdout + proof.info.stderr).toBe(0);
    expect(proof.proof?.probes.map((p) => [p.name, p.ok])).toEqual([["tls_probe", true]]);
  }, 180_000);

  it.skipIf(!onPath("cc"))(
    "case G5: a preload setup plants to make the wiring program lie does not fool the re-proof, which runs in a clean root",
    async () => {
      await work("g5");
      const first = await wiring("g5", "setup", wiringInput("g5"));
      expect(first.proof?.ok, first.info.stdout + first.info.stderr).toBe(true);
      const source = join(scratch, "lie.c");
      const library = join(scratch, "lie.so");
      writeFileSync(source, LYING_PRELOAD);
      const cc = await host(["cc", "-shared", "-fPIC", "-O2", "-o", library, source]);
      expect(cc.code, cc.stderr).toBe(0);
      // Setup's root plants it, with a true proof (the first wiring's) to replay.
      const plant = await api.run("g5", {
        argv: [
          "sh",
          "-c",
          'base64 -d > /usr/local/lib/bw-lie.so && printf %s "$LIE" > /etc/bw-lie.json && echo /usr/local/lib/bw-lie.so > /etc/ld.so.preload',
        ],
        stage: "setup",
        stdin: readFileSync(library).toString("base64"),
        env: { LIE: first.info.stdout },
      });
      expect(plant.exitCode, plant.stderr).toBe(0);

      // Sealed with a CA the run's proxy does not chain to: the redirect is not what the proof
      // is asked to find, so a true re-proof must fail.
      const other = await createTestCa("Benchwright seal test: a CA the proxy does not hold");
      const sealed = await api.call("POST", "/v1/sandboxes/g5/seal", {
        ...sealBody,
        caCertPem: other.certPem,
      });
      expect(sealed.status, JSON.stringify(sealed.body)).toBe(200);
      const input = wiringInput("g5", { caCertPem: other.certPem, installed: true });
      // On the sandbox's own loader (what the re-proof ran on before), the preload answers for
      // the wiring program: a passing proof, exit 0. So the lie works where it is in force.
      const lied = await api.run("g5", {
        argv: [NODE_MOUNT, `${IMAGE_MOUNT}/wiring.cjs`],
        stage: "execute",
        stdin: JSON.stringify(input),
      });
      expect(lied.exitCode).toBe(0);
      expect(WiringProof.parse(JSON.parse(lied.stdout)).ok).toBe(true);
      // The re-proof (bw-wiring in the execute stage) runs in the clean root: no preload, and the
      // probe finds the proxy's chain ending at another CA than the one it was asked for.
      const honest = await wiring("g5", "execute", input);
      expect(honest.info.exitCode, honest.info.stdout + honest.info.stderr).toBe(1);
      expect(honest.proof?.probes).toEqual([expect.objectContaining({ name: "tls_probe", ok: false })]);
      expect(honest.info.stdout).not.toBe(first.info.stdout);

      // Sealed with the run's CA, the same sandbox (preload still in force inside) proves again.
      expect((await seal("g5")).status).toBe(200);
      expect((await api.sh("g5", "cat /etc/ld.so.preload")).stdout).toBe("/usr/local/lib/bw-lie.so\n");
      const proof = await wiring("g5", "execute", wiringInput("g5", { installed: true }));
      expect(proof.info.exitCode, proof.info.stdout + proof.info.stderr).toBe(0);
      expect(proof.proof?.probes.map((p) => [p.name, p.ok])).toEqual([["tls_probe", true]]);
      // The clean root takes nothing of the caller's environment (LD_PRELOAD would be a way in).
      const withEnv = await api.call("POST", "/v1/sandboxes/g5/exec", {
        argv: ["bw-wiring"],
        stage: "execute",
        env: { LD_PRELOAD: "/usr/local/lib/bw-lie.so" },
        stdin: JSON.stringify(input),
      });
      expect([withEnv.status, withEnv.body.code]).toEqual([400, "invalid_request"]);
    },
    180_000,
  );

  it("case L7: a fork storm setup leaves is frozen and killed at seal; none of it runs beside execute", async () => {
    await work("l7", { resources: { memoryMb: 256, pids: 512, cpus: 0.5 } });
    // Daemons that fork without end (short-lived children, and each daemon's own loop), kept
    // below the pids limit so that the storm is still running when the seal comes.
    const storm = await api.sh(
      "l7",
      "for i in $(seq 24); do setsid sh -c 'while :; do sh -c : ; done' </dev/null >/dev/null 2>&1 & done; sleep 1; ps -eo uid= | grep -c '^ *0$'",
      "setup",
    );
    expect(storm.exitCode).toBe(0);
    expect(Number(storm.stdout)).toBeGreaterThanOrEqual(24);
    const res = await seal("l7");
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.killed).toBeGreaterThanOrEqual(24);
    // Nothing of the setup stage is left: no process of its uid, nothing in its cgroup.
    const ps = await api.sh("l7", "ps -eo uid=,args=");
    expect(ps.stdout.split("\n").filter((l) => /^\s*0 /.test(l))).toEqual([]);
    for (const dir of cgroupDirs("l7")) expect(procsBelow(join(dir, "setup")), dir).toEqual([]);
  }, 180_000);

  // cgroup v1 (these machines): a process can be in the sandbox's setup cgroup of the pids
  // hierarchy and in a frozen freezer cgroup of the test's own, where no SIGKILL takes effect.
  const v1 = (() => {
    const c = detectCgroups();
    return c.ok && c.host.version === 1 && c.host.parents.freezer !== undefined;
  })();

  it.skipIf(!v1)(
    "case L7: setup processes the kill rounds cannot empty stop the seal (setup_not_sealed); nothing runs beside them",
    async () => {
      await work("l7b");
      // A setup-uid process of the sandbox that outlives every kill round: in the setup cgroup of
      // every hierarchy but the freezer, where it is in a frozen cgroup the seal does not thaw, so
      // the SIGKILLs stay pending (what an unkillable setup process would look like).
      const dirs = cgroupDirs("l7b");
      const freezer = dirs.find((d) => d.includes("/freezer/")) as string;
      const held = join(freezer, "..", `bwt-l7-${secret().slice(0, 8)}`);
      mkdirSync(held);
      for (const d of dirs) mkdirSync(join(d, "setup", "survivor"), { recursive: true });
      const procs = [
        ...dirs.filter((d) => d !== freezer).map((d) => join(d, "setup", "survivor", "cgroup.procs")),
        join(held, "cgroup.procs"),
      ];
      const survivor = spawn(
        "sh",
        [
          "-c",
          `for f in ${procs.join(" ")}; do echo $$ > "$f" || exit 1; done; exec nsenter --user="$U" -t "$P" --mount --pid --net --ipc -- sleep 1000`,
        ],
        {
          env: {
            PATH: "/usr/sbin:/usr/bin:/sbin:/bin",
            U: join(stateDir, "sandboxes", "l7b", "userns"),
            P: String(initPid(dirs)),
          },
          stdio: "ignore",
        },
      );
      try {
        // nsenter and the sleep it forked into the sandbox, then frozen where the seal cannot thaw.
        await until("the survivor in the sandbox", () => procsBelow(held).length === 2);
        writeFileSync(join(held, "freezer.state"), "FROZEN");
        await until(
          "the survivor frozen",
          () => readFileSync(join(held, "freezer.state"), "utf8").trim() === "FROZEN",
        );
        const res = await seal("l7b");
        expect([res.status, res.body.code]).toEqual([409, "setup_not_sealed"]);
        expect(res.body.detail).toMatch(/2 process\(es\) of the setup stage are still running/);
        // What is left is held frozen by the agent too, and the sandbox runs nothing more.
        expect(readFileSync(join(freezer, "setup", "freezer.state"), "utf8").trim()).toBe("FROZEN");
        const exec = await api.call("POST", "/v1/sandboxes/l7b/exec", { argv: ["true"], stage: "execute" });
        expect([exec.status, exec.body.code]).toEqual([409, "setup_not_sealed"]);
        const again = await seal("l7b");
        expect([again.status, again.body.code]).toEqual([409, "setup_not_sealed"]);
      } finally {
        // Thawed, it dies of the SIGKILL the seal left pending (or of this one).
        survivor.kill("SIGKILL");
        writeFileSync(join(held, "freezer.state"), "THAWED");
        for (const pid of procsBelow(held)) process.kill(pid, "SIGKILL");
        await until("the survivor gone", () => procsBelow(held).length === 0);
        rmdirSync(held);
      }
      // Destroying the sandbox kills what was frozen in it too.
      expect((await api.call("DELETE", "/v1/sandboxes/l7b")).status).toBe(204);
      expect(dirs.flatMap((d) => procsBelow(d))).toEqual([]);
    },
    180_000,
  );
});

/** Every process in the cgroup `dir` and below. */
function procsBelow(dir: string): number[] {
  let procs: number[];
  try {
    procs = readFileSync(join(dir, "cgroup.procs"), "utf8").split("\n").filter(Boolean).map(Number);
  } catch {
    return [];
  }
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (e.isDirectory()) procs.push(...procsBelow(join(dir, e.name)));
  }
  return procs;
}

/** Host PID of the sandbox's PID 1: the process of its `init` leaf that is PID 1 inside. */
function initPid(dirs: string[]): number {
  for (const dir of dirs) {
    for (const pid of procsBelow(join(dir, "init"))) {
      const nspid = /^NSpid:\s+(.*)$/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1];
      if (nspid?.trim().split(/\s+/).at(-1) === "1" && nspid.trim().split(/\s+/).length === 2) return pid;
    }
  }
  throw new Error("the sandbox's PID 1 is not in its init cgroup");
}
