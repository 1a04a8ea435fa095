import { spawnSync } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CollectManifest, UnpackResult } from "@benchwright/shared/contract/bundle";
import { PROBE_HEADER, WIRING_PROBE_HOST } from "@benchwright/shared/contract/proxy-wire";
import type { WiringInput } from "@benchwright/shared/contract/wiring";
import { WiringProof } from "@benchwright/shared/contract/wiring";
import { renderHostsFile } from "@benchwright/shared/policy/hosts-file";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { detectCgroups } from "../../local-agent/cgroups";
import { ROOTFS_DIR } from "../../local-agent/rootfs";
import { REPO_ROOT, type RunningAgent } from "../../local-agent/server";
import { StateDir } from "../../local-agent/state-dir";
import { BASE_HOSTS } from "../../local-agent/wiring-files";
import { createTestCa, type TestCa } from "../../scripts/lib/test-ca";
import { BAD_BUNDLES, gnuTar } from "../unit/archive-fixtures";
import {
  type AgentClient,
  ensureWorkImageBuilt,
  leftovers,
  secret,
  startTestAgent,
  type TestAgent,
  TestUpstream,
  whyNotRunnable,
} from "./harness";

// The setup stage and the sandbox's own filesystem (cases G1-G5, G7), on real namespaces,
// cgroups and the work image's root filesystem: a sandbox sees nothing of the host; its setup
// stage is root of its own filesystem (apt and pip can install), and once sealed nothing that
// stage did survives into the execute stage with any power: its processes are gone, the wiring's
// files are the agent's again, setuid bits and file capabilities grant nothing, and the limits
// of its cgroup hold a fork bomb and a memory hog.

const whyNot = whyNotRunnable();
if (whyNot) console.warn(`setup-stage suites skipped: ${whyNot} (they need root on Linux)`);

const UIDS: [number, number] = [340_000, 340_400];
const RUN = "run-s";
const HOSTS = ["api.example.test"];

describe.skipIf(whyNot !== null)("local agent: the setup stage and the sandbox's own filesystem", () => {
  let testAgent: TestAgent;
  let agent: RunningAgent;
  let api: AgentClient;
  let upstream: TestUpstream;
  let stateDir: string;
  let scratch: string;
  let ca: TestCa;
  const agentSecret = secret();
  const markerName = `bw-g1-marker-${secret().slice(0, 12)}`;
  const markers = [join("/var/tmp", markerName), join("/opt", markerName)];
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

  async function seal(id: string, body: Record<string, unknown> = {}) {
    const res = await api.call("POST", `/v1/sandboxes/${id}/seal`, {
      routing: "default",
      hostsFile: HOSTS,
      caCertPem: ca.certPem,
      ...body,
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    return res.body as { killed: number };
  }

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

  beforeAll(async () => {
    await ensureWorkImageBuilt();
    for (const m of markers) {
      writeFileSync(m, `${markerName}\n`);
      chmodSync(m, 0o644);
    }
    stateDir = mkdtempSync(join(tmpdir(), "bw-setup-test-"));
    scratch = mkdtempSync(join(tmpdir(), "bw-setup-scratch-"));
    ca = await createTestCa("Benchwright setup-stage test run CA");
    testAgent = await startTestAgent({ secret: agentSecret, stateDir, uidBase: UIDS[0], log: () => {} });
    ({ agent, api, upstream } = testAgent);
    await api.create({ kind: "proxy", id: "px", runId: RUN });
    // A stand-in for the proxy's TLS listener: the wiring probe's answer (403 with the probe
    // header, a certificate for the probe host from the "run CA"), and "proxy:<port>" on 8080.
    const leaf = await ca.issue([WIRING_PROBE_HOST]);
    await api.serve(
      "px",
      `const [key, cert] = JSON.parse(process.argv[1]);
       require("net").createServer((s) => s.end("proxy:8080")).listen(8080);
       require("https").createServer({ key, cert }, (req, res) => {
         res.writeHead(403, { "${PROBE_HEADER}": "refused" }).end();
       }).listen(8443, () => console.log("ready"));`,
      "setup",
      [JSON.stringify([leaf.keyPem, leaf.certPem + ca.certPem])],
    );
  }, 300_000);

  afterAll(async () => {
    await testAgent?.close();
    for (const m of markers) rmSync(m, { force: true });
    for (const d of [stateDir, scratch]) if (d) rmSync(d, { recursive: true, force: true });
    expect(await leftovers(UIDS)).toEqual([]);
  }, 60_000);

  it("case G1: a walk of the sandbox's whole filesystem finds no host file, in either stage", async () => {
    await work("g1");
    const walk =
      `find / \\( -path /proc -o -path /sys -o -path /dev \\) -prune -o -name '${markerName}*' -print 2>/dev/null; ` +
      `for p in ${REPO_ROOT} ${stateDir} ${ROOTFS_DIR} /var/lib/benchwright /work; do [ -e "$p" ] && echo "present: $p"; done; ` +
      "echo walked";
    for (const stage of ["setup", "execute"] as const) {
      const res = await api.sh("g1", walk, stage);
      expect(res.stdout, stage).toBe("walked\n");
    }
    // The walk can see a file where there is one: the markers are on the host, world-readable.
    expect(readFileSync(markers[0] as string, "utf8")).toBe(`${markerName}\n`);
    const control = await api.sh("g1", `echo x > /tmp/${markerName}-inside; ${walk}`, "execute");
    expect(control.stdout).toBe(`/tmp/${markerName}-inside\nwalked\n`);
    // Its root is the work image's, under an overlay of its own; no /sys, a /dev of its own.
    const fs = await api.sh("g1", "cat /etc/os-release | head -1; ls /sys | wc -l; ls /dev", "execute");
    expect(fs.stdout).toMatch(/^PRETTY_NAME="Debian GNU\/Linux 12 \(bookworm\)"\n0\n/);
    expect(fs.stdout.split("\n").slice(2, -1).sort()).toEqual(
      [
        "fd",
        "full",
        "null",
        "ptmx",
        "pts",
        "random",
        "shm",
        "stderr",
        "stdin",
        "stdout",
        "tty",
        "urandom",
        "zero",
      ].sort(),
    );
  });

  it("lets the setup stage write the image's system directories (apt, pip) and the execute stage not", async () => {
    await work("pkg");
    const places = ["/usr/lib/python3/dist-packages/bw-probe", "/var/lib/dpkg/bw-probe", "/etc/bw-probe"];
    const setup = await api.sh("pkg", places.map((p) => `touch ${p}`).join(" && "), "setup");
    expect(setup).toMatchObject({ exitCode: 0, stderr: "" });
    for (const p of places) {
      const exec = await api.sh("pkg", `touch ${p}.2`);
      expect(exec.stderr, p).toContain("Permission denied");
    }
    // A real pip install as setup's root (a wheel made in the sandbox, no index), used in execute.
    const wheel = `
import zipfile, base64, hashlib
files = {"bwpkg/__init__.py": b"VALUE = 'installed by setup'\\n",
         "bwpkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\\nName: bwpkg\\nVersion: 1.0\\n",
         "bwpkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\\nGenerator: bw\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
rec = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\\n" for n, d in files.items())
with zipfile.ZipFile("/tmp/bwpkg-1.0-py3-none-any.whl", "w") as z:
    for n, d in files.items(): z.writestr(n, d)
    z.writestr("bwpkg-1.0.dist-info/RECORD", rec + "bwpkg-1.0.dist-info/RECORD,,\\n")
`;
    const pip = await api.run("pkg", {
      argv: [
        "sh",
        "-c",
        'python3 -c "$WHEEL" && python3 -m pip install --quiet --no-index --break-system-packages /tmp/bwpkg-1.0-py3-none-any.whl',
      ],
      stage: "setup",
      env: { WHEEL: wheel },
    });
    expect(pip.exitCode, pip.stderr).toBe(0);
    const use = await api.sh(
      "pkg",
      "python3 -c 'import bwpkg; print(bwpkg.VALUE)'; rm -rf /usr/local/lib/python3*/dist-packages/bwpkg",
    );
    expect(use.stdout).toBe("installed by setup\n");
    expect(use.stderr).toContain("Permission denied");
  });

  it("case G2: after seal the hosts file, resolver and CA bundle are the agent's again, proved from execute", async () => {
    await work("g2");
    const first = await wiring("g2", "setup", wiringInput("g2"));
    expect(first.proof?.ok, first.info.stdout + first.info.stderr).toBe(true);
    const resolvBefore = (await api.sh("g2", "cat /etc/resolv.conf")).stdout;
    // Setup's root takes the wiring apart: another address for the vault's host, a bundle without
    // the run CA, another resolver, the run CA's file swapped for a link to /etc/shadow (if the
    // agent followed it from outside, it would write the host's), the hosts file made writable.
    const tamper = [
      "printf '127.0.0.1 localhost\\n10.0.0.9 api.example.test\\n10.0.0.9 probe.benchwright.invalid\\n' > /etc/hosts",
      "head -c 2000 /etc/ssl/certs/ca-certificates.crt > /tmp/b && cat /tmp/b > /etc/ssl/certs/ca-certificates.crt",
      "echo 'nameserver 10.0.0.9' > /etc/resolv.conf",
      "rm -f /run/benchwright/run-ca.pem && ln -s /etc/shadow /run/benchwright/run-ca.pem",
      "chmod 666 /etc/hosts /etc/resolv.conf /etc/ssl/certs/ca-certificates.crt",
    ].join(" && ");
    expect((await api.sh("g2", tamper, "setup")).exitCode).toBe(0);
    const broken = await wiring("g2", "execute", wiringInput("g2", { installed: true }));
    expect(broken.info.exitCode).toBe(1); // the check sees it: the proof is not taken on trust
    expect(broken.proof?.probes).toEqual([expect.objectContaining({ name: "install", ok: false })]);

    expect(await seal("g2")).toEqual({ killed: 0 });
    const files = await api.sh(
      "g2",
      "cat /etc/hosts; echo ---; cat /etc/resolv.conf; echo ---; stat -c '%u %a' /etc/hosts /etc/resolv.conf /etc/ssl/certs/ca-certificates.crt /run/benchwright /run/benchwright/run-ca.pem",
    );
    const [hosts, resolv, owners] = files.stdout.split("---\n");
    expect(hosts).toBe(renderHostsFile(BASE_HOSTS, "default", proxyAddress.g2 as string, HOSTS));
    expect(resolv).toBe(resolvBefore);
    // The host's root: "nobody" in the sandbox, writable by no one there.
    expect(owners?.trim().split("\n")).toEqual([
      "65534 644",
      "65534 644",
      "65534 644",
      "65534 755",
      "65534 644",
    ]);
    const bundle = await api.sh("g2", "cat /etc/ssl/certs/ca-certificates.crt");
    expect(bundle.stdout).toContain(ca.certPem.trim().split("\n")[1]);
    expect(bundle.stdout.length).toBeGreaterThan(100_000); // the image's whole bundle again
    const proof = await wiring("g2", "execute", wiringInput("g2", { installed: true }));
    expect(proof.info.exitCode, proof.info.stdout + proof.info.stderr).toBe(0);
    expect(proof.proof?.probes.map((p) => [p.name, p.ok])).toEqual([["tls_probe", true]]);
    // The execute stage cannot change any of them; the setup stage is over.
    for (const f of [
      "/etc/hosts",
      "/etc/resolv.conf",
      "/etc/ssl/certs/ca-certificates.crt",
      "/run/benchwright/x",
    ]) {
      expect((await api.sh("g2", `echo x >> ${f}`)).stderr, f).toMatch(/Permission denied/);
    }
    const late = await api.call("POST", "/v1/sandboxes/g2/exec", { argv: ["true"], stage: "setup" });
    expect([late.status, late.body.code]).toEqual([409, "sealed"]);
    // Idempotent: a repeated seal installs the same files again.
    expect(await seal("g2")).toEqual({ killed: 0 });
    expect((await api.sh("g2", "cat /etc/hosts")).stdout).toBe(hosts);
  });

  it("rewrites a sealed sandbox's hosts redirect from outside (a vault edit, default routing)", async () => {
    const res = await api.call("PUT", "/v1/sandboxes/g2/hosts", { hostsFile: ["api2.example.test"] });
    expect(res.status).toBe(204);
    const hosts = (await api.sh("g2", "cat /etc/hosts; stat -c '%u %a' /etc/hosts")).stdout;
    expect(hosts).toBe(
      `${renderHostsFile(BASE_HOSTS, "default", proxyAddress.g2 as string, ["api2.example.test"])}65534 644\n`,
    );
    const bad = await api.call("PUT", "/v1/sandboxes/px/hosts", { hostsFile: [] });
    expect([bad.status, bad.body.code]).toEqual([400, "invalid_request"]);
    const unknown = await api.call("PUT", "/v1/sandboxes/nope/hosts", { hostsFile: [] });
    expect([unknown.status, unknown.body.code]).toEqual([404, "not_found"]);
  });

  it("case G3: a root daemon setup leaves behind is gone before execute, and reaches nothing", async () => {
    await work("g3");
    // Double-forked, in a session of its own: it sends what /tmp/go says to the upstream.
    const daemon = `import os, socket, time
while True:
    try:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(open("/tmp/go", "rb").read(), ("${TestUpstream.address}", 9001))
    except OSError:
        pass
    time.sleep(0.1)`;
    const start = await api.run("g3", {
      argv: [
        "sh",
        "-c",
        '(setsid python3 -c "$DAEMON" </dev/null >/dev/null 2>&1 &); (setsid sh -c "while :; do sleep 1; done" </dev/null >/dev/null 2>&1 &)',
      ],
      stage: "setup",
      env: { DAEMON: daemon },
    });
    expect(start.exitCode).toBe(0);
    // The daemon works: before the seal it reaches the upstream.
    await api.sh("g3", "printf g3-before > /tmp/go; chmod 666 /tmp/go", "setup");
    await upstream.waitFor((l) => l === "udp:9001:g3-before");
    const ps = async () => (await api.sh("g3", "ps -eo uid=,args=")).stdout;
    expect(await ps()).toMatch(/^\s*0 python3 -c/m);
    const { killed } = await seal("g3");
    expect(killed).toBeGreaterThanOrEqual(2);
    // No process of the setup stage's uid is left (PID 1 and its sleep are the host's: "nobody").
    expect((await ps()).split("\n").filter((l) => /^\s*0 /.test(l))).toEqual([]);
    await api.sh("g3", "printf g3-after > /tmp/go");
    await api.probe("g3", [{ host: TestUpstream.address, port: 9001, udp: "g3-control" }]);
    await upstream.waitFor((l) => l === "udp:9001:g3-control");
    await new Promise((r) => setTimeout(r, 500));
    expect(upstream.received(9001, "g3-after")).toBe(false);
  });

  it("case G4: a setuid-root binary or file capabilities setup installs grant nothing in execute", async () => {
    await work("g4");
    const install = [
      "cp /bin/dash /usr/local/bin/rootsh && chmod 4755 /usr/local/bin/rootsh",
      "cp /usr/bin/python3 /usr/local/bin/rootpy && chmod 6755 /usr/local/bin/rootpy",
      "cp /usr/bin/python3 /usr/local/bin/cappy",
      // What setcap does (the image has no libcap2-bin): a security.capability xattr, every
      // capability permitted and effective.
      `python3 -c "import os, struct; os.setxattr('/usr/local/bin/cappy', 'security.capability', struct.pack('<5I', 0x02000001, 0xffffffff, 0, 0x1ff, 0))" && echo caps-set`,
      "stat -c '%a %u' /usr/local/bin/rootsh /usr/local/bin/rootpy",
    ].join("; ");
    const setup = await api.sh("g4", install, "setup");
    expect(setup.stdout).toMatch(/caps-set\n4755 0\n6755 0\n$/);
    await seal("g4");
    const asRoot = await api.sh(
      "g4",
      "/usr/local/bin/rootsh -p -c 'id -u; id -g; grep CapEff /proc/self/status'",
    );
    expect(asRoot.stdout).toBe("1\n1\nCapEff:\t0000000000000000\n");
    const py =
      "import os; print(os.geteuid(), os.getegid(), open('/proc/self/status').read().split('CapEff:')[1].split()[0])";
    expect((await api.sh("g4", `/usr/local/bin/rootpy -c "${py}"`)).stdout).toBe("1 1 0000000000000000\n");
    // The capability is on the file (the execute stage reads it), and running the file grants none.
    const xattr = await api.sh(
      "g4",
      `python3 -c "import os; print(len(os.getxattr('/usr/local/bin/cappy', 'security.capability')) > 0)"`,
    );
    expect(xattr.stdout).toBe("True\n");
    expect((await api.sh("g4", `/usr/local/bin/cappy -c "${py}"`)).stdout).toBe("1 1 0000000000000000\n");
  });

  it("case G5: profile hooks, cron entries and /etc/ld.so.preload change nothing of the boundary", async () => {
    await work("g5", { routing: "catch-all" });
    const hooks = [
      "echo 'export BW_G5_HOOK=ran' > /etc/profile.d/bw-g5.sh",
      "mkdir -p /etc/cron.d && echo '* * * * * root echo hi' > /etc/cron.d/bw-g5",
      "echo /tmp/bw-g5-evil.so > /etc/ld.so.preload",
    ].join(" && ");
    expect((await api.sh("g5", hooks, "setup")).exitCode).toBe(0);
    expect(await seal("g5", { routing: "catch-all", hostsFile: [] })).toEqual({ killed: 0 });
    const res = await api.sh(
      "g5",
      "sh -lc 'echo hook=$BW_G5_HOOK'; id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; echo x >> /etc/hosts; echo x >> /etc/ssl/certs/ca-certificates.crt; ps -eo args | grep -c '[c]ron'",
    );
    // The preload is in force for the sandbox's own programs (ld.so complains about it), which
    // run as the execute uid: it gains them nothing.
    expect(res.stderr).toContain("bw-g5-evil.so");
    expect(res.stderr).toMatch(
      /\/etc\/hosts: Permission denied[\s\S]*ca-certificates\.crt: Permission denied/,
    );
    expect(res.stdout).toBe("hook=ran\n1\nCapEff:\t0000000000000000\nNoNewPrivs:\t1\n0\n");
    // The proxy is still the only way out under catch-all: a direct connection is refused.
    const [direct] = await api.probe("g5", [{ host: TestUpstream.address, port: 9000 }]);
    expect(direct).toMatch(/^ERR E(HOSTUNREACH|CONNREFUSED)/);
    // The agent runs nothing of the sandbox for its own work: freezing and killing still work.
    expect((await api.call("POST", "/v1/sandboxes/g5/freeze", { frozen: true })).status).toBe(204);
    expect((await api.call("POST", "/v1/sandboxes/g5/freeze", { frozen: false })).status).toBe(204);
    expect((await api.call("GET", "/v1/health")).body.ok).toBe(true);
  });

  it("case G7: a fork bomb and a memory hog are held by the sandbox's cgroup; the rest keeps answering", async () => {
    await work("g7", { resources: { memoryMb: 128, pids: 64, cpus: 0.5 } });
    await work("g7b");
    // Its cgroup has those limits (the kernel enforces them; the agent reads what it counted).
    const cgroups = detectCgroups();
    if (!cgroups.ok) throw new Error(cgroups.problem);
    const dir = (c: "memory" | "pids" | "cpu") =>
      join(cgroups.host.parents[c] as string, `${new StateDir(stateDir).tag}-g7`);
    const read = (c: "memory" | "pids" | "cpu", file: string) =>
      readFileSync(join(dir(c), file), "utf8").trim();
    expect(read("memory", "memory.limit_in_bytes")).toBe(String(128 * 1024 * 1024));
    expect(read("pids", "pids.max")).toBe("64");
    expect([read("cpu", "cpu.cfs_quota_us"), read("cpu", "cpu.cfs_period_us")]).toEqual(["50000", "100000"]);
    const bomb = await api.start("g7", {
      argv: ["sh", "-c", "f() { f | f & }; f; sleep 60"],
      stage: "execute",
    });
    // While it runs: the agent, another sandbox and the proxy answer.
    const t = Date.now();
    expect((await api.call("GET", "/v1/health")).body.ok).toBe(true);
    expect((await api.sh("g7b", "echo alive")).stdout).toBe("alive\n");
    expect(await api.probe("g7b", [{ host: proxyAddress.g7b as string, port: 80 }])).toEqual(["proxy:8080"]);
    expect(Date.now() - t).toBeLessThan(10_000);
    let info = await api.poll("g7", bomb.execId, "?waitMs=20000");
    while (info.state === "running") info = await api.poll("g7", bomb.execId, "?waitMs=20000");
    expect(info.limit).toBe("pids");
    const hog = await api.run("g7", {
      argv: ["python3", "-c", "x = bytearray(512 * 1024 * 1024); print('allocated')"],
      stage: "execute",
    });
    expect(hog).toMatchObject({ state: "exited", limit: "memory", stdout: "" });
    // The sandbox itself lives on, and an exec that stays in bounds has no limit set.
    const after = await api.sh("g7", "echo fine");
    expect(after).toMatchObject({ exitCode: 0, stdout: "fine\n" });
    expect(after.limit).toBeUndefined();
    expect((await api.sh("g7b", "echo alive")).stdout).toBe("alive\n");
  }, 60_000);

  it("unpacks a bundle into the working directory as the execute uid, and refuses a bad one", async () => {
    const src = join(scratch, "bench");
    mkdirSync(join(src, "lib"), { recursive: true });
    writeFileSync(join(src, "task_impl.py"), "import lib.helper\nprint(lib.helper.answer())\n");
    writeFileSync(join(src, "lib", "__init__.py"), "");
    writeFileSync(join(src, "lib", "helper.py"), "def answer():\n    return 42\n");
    const ok = await fetch(`${agent.url}/v1/sandboxes/pkg/bundle?dir=/home/sandbox`, {
      method: "PUT",
      headers: { authorization: `Bearer ${agentSecret}`, "content-type": "application/gzip" },
      body: gnuTar(src, ["."]),
    });
    expect(ok.status).toBe(200);
    const unpacked = UnpackResult.parse(await ok.json());
    expect(unpacked.ok && unpacked.files).toBeGreaterThanOrEqual(3);
    const run = await api.sh("pkg", "python3 task_impl.py; stat -c '%u %n' task_impl.py lib/helper.py");
    expect(run.stdout).toBe("42\n1 task_impl.py\n1 lib/helper.py\n");
    for (const bad of BAD_BUNDLES.filter((b) => b.attack === "H1").slice(0, 4)) {
      const res = await fetch(`${agent.url}/v1/sandboxes/pkg/bundle?dir=/home/sandbox/bad`, {
        method: "PUT",
        headers: { authorization: `Bearer ${agentSecret}` },
        body: await bad.make(scratch, "/home/outside"),
      });
      expect(res.status, bad.name).toBe(422);
      expect((await res.json()) as UnpackResult, bad.name).toMatchObject({ ok: false, code: bad.code });
    }
    expect((await api.sh("pkg", "ls /home; ls /home/sandbox")).stdout).toBe(
      "sandbox\nbad\nlib\nout\ntask_impl.py\n",
    );
    const proxyBundle = await api.call("PUT", "/v1/sandboxes/px/bundle?dir=/home/sandbox", "x");
    expect([proxyBundle.status, proxyBundle.body.code]).toEqual([400, "invalid_request"]);
  });

  it("collects artifacts from $BW_OUT as the execute uid, never following a link", async () => {
    await api.sh(
      "pkg",
      "mkdir -p out/sub && echo result > out/result.txt && echo deep > out/sub/deep.txt && ln -s /etc/passwd out/passwd",
    );
    const res = await fetch(
      `${agent.url}/v1/sandboxes/pkg/artifacts?dir=/home/sandbox/out&maxBytes=1000000&maxFiles=10`,
      {
        headers: { authorization: `Bearer ${agentSecret}` },
      },
    );
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("application/gzip");
    const archive = join(scratch, "artifacts.tar.gz");
    writeFileSync(archive, Buffer.from(await res.arrayBuffer()));
    const list = spawnSync("tar", ["-tzf", archive], { encoding: "utf8" });
    expect(list.stdout.trim().split("\n").sort()).toEqual(
      ["files/result.txt", "files/sub/deep.txt", "manifest.json"].sort(),
    );
    const manifest = CollectManifest.parse(
      JSON.parse(spawnSync("tar", ["-xzOf", archive, "manifest.json"], { encoding: "utf8" }).stdout),
    );
    expect(manifest.files.map((f) => f.path).sort()).toEqual(["result.txt", "sub/deep.txt"]);
    expect(manifest.cut).toEqual([{ path: "passwd", reason: "symlink", size: null }]);
  });

  it("refuses endpoints' bad input with a stable code", async () => {
    for (const [method, path, body] of [
      ["POST", "/v1/sandboxes/g1/seal", { routing: "default", hostsFile: [], caCertPem: "not a cert" }],
      ["POST", "/v1/sandboxes/g1/seal", { routing: "catch-all", hostsFile: [], caCertPem: null }],
      ["POST", "/v1/sandboxes/px/seal", { routing: "default", hostsFile: [], caCertPem: null }],
      ["GET", "/v1/sandboxes/pkg/artifacts?dir=relative", undefined],
      ["GET", "/v1/sandboxes/pkg/artifacts?dir=/home/../etc", undefined],
    ] as const) {
      const res = await api.call(method, path, body);
      expect([res.status, res.body.code], path).toEqual([400, "invalid_request"]);
    }
    // g1 was not sealed by any of them: its setup stage still runs.
    expect((await api.sh("g1", "id -u", "setup")).stdout).toBe("0\n");
  });

  it("keeps no process, cgroup or mount of a destroyed sandbox", async () => {
    const uid = Number(
      (await api.sh("g7", "cat /proc/self/uid_map")).stdout.split("\n")[1]?.trim().split(/\s+/)[1],
    );
    const started = Date.now();
    expect((await api.call("DELETE", "/v1/sandboxes/g7")).status).toBe(204);
    expect(Date.now() - started).toBeLessThan(5_000);
    const left = await leftovers([uid, uid + 1]);
    expect(left.filter((l) => /^process |-g7$|\/g7\/userns$/.test(l))).toEqual([]);
  });
});
