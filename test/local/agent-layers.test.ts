import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { PROBE_HEADER, WIRING_PROBE_HOST } from "@benchwright/shared/contract/proxy-wire";
import { type WiringInput, WiringProof } from "@benchwright/shared/contract/wiring";
import { packTar, unpackTar } from "modern-tar";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOTFS_DIR, ROOTFS_UID_BASE } from "../../local-agent/rootfs";
import { createTestCa, type TestCa } from "../../scripts/lib/test-ca";
import {
  type AgentClient,
  ensureWorkImageBuilt,
  leftovers,
  secret,
  startTestAgent,
  type TestAgent,
  whyNotRunnable,
} from "./harness";

// Setup layers on the local agent (issue 34), on real namespaces through its HTTP API: a sealed
// builder's changes kept as a layer and a sandbox started from it (a venv-like tree under
// /home/sandbox, a file under /usr); what a layer never keeps (case P4); a layer planted straight
// into the store, which binds nothing more than a fresh sandbox (case P5); a layer missing or not
// matching its digest is never started (case P3); one in use is not deleted (case P6).

const whyNot = whyNotRunnable();
if (whyNot) console.warn(`setup layer suites skipped: ${whyNot} (they need root on Linux)`);

const UIDS: [number, number] = [360_000, 360_400];
const RUN = "run-layers";
const HOSTS = ["api.example.test"];
const MAX = 256 * 1024 * 1024;

describe.skipIf(whyNot !== null)("local agent: setup layers", () => {
  let testAgent: TestAgent;
  let api: AgentClient;
  let stateDir: string;
  let layersDir: string;
  let ca: TestCa;
  let rootfs: string;
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
  const seal = (id: string) =>
    api.call("POST", `/v1/sandboxes/${id}/seal`, {
      routing: "default",
      hostsFile: HOSTS,
      caCertPem: ca.certPem,
    });
  const capture = (id: string, maxBytes = MAX) =>
    api.call("POST", `/v1/sandboxes/${id}/capture`, { maxBytes });
  const setup = async (id: string, script: string, stdin?: string) => {
    const info = await api.run(id, {
      argv: ["sh", "-c", script],
      stage: "setup",
      ...(stdin ? { stdin } : {}),
    });
    expect(info.exitCode, info.stderr).toBe(0);
    return info;
  };
  function wiringInput(id: string): WiringInput {
    return {
      mode: "default",
      caCertPem: ca.certPem,
      proxyAddress: proxyAddress[id] as string,
      hostsFile: HOSTS,
      probe: { directTarget: null },
      installed: true,
    };
  }
  const layerNames = async (digest: string) =>
    (await unpackTar(readFileSync(join(layersDir, digest.slice(7), "layer.tar")))).map((e) => e.header.name);

  /**
   * A layer written straight into the store, as an attacker with the store's disk would: `root/`
   * extracted by GNU tar from `entries` (owners and xattrs as given), that archive as layer.tar,
   * and the digest that matches it. Returns the digest.
   */
  async function plant(entries: Parameters<typeof packTar>[0]): Promise<string> {
    const tar = await packTar(entries);
    const hex = createHash("sha256").update(tar).digest("hex");
    const tmp = join(layersDir, `plant-${hex.slice(0, 8)}`);
    mkdirSync(join(tmp, "root"), { recursive: true });
    writeFileSync(join(tmp, "layer.tar"), tar);
    const x = spawnSync(
      "tar",
      ["-x", "-f", "-", "--numeric-owner", "-p", "--xattrs", "--xattrs-include=*", "-C", join(tmp, "root")],
      { input: tar },
    );
    expect(x.status, x.stderr.toString()).toBe(0);
    writeFileSync(join(tmp, ".complete"), "");
    renameSync(tmp, join(layersDir, hex));
    return `sha256:${hex}`;
  }

  beforeAll(async () => {
    await ensureWorkImageBuilt();
    stateDir = mkdtempSync(join(tmpdir(), "bw-layers-test-"));
    layersDir = mkdtempSync(join(tmpdir(), "bw-layers-store-"));
    ca = await createTestCa("Benchwright setup layer test run CA");
    testAgent = await startTestAgent({
      secret: secret(),
      stateDir,
      uidBase: UIDS[0],
      log: () => {},
      layersDir,
    });
    ({ api } = testAgent);
    const health = await api.call("GET", "/v1/health");
    expect(health.body.workImageId).toMatch(/^sha256:[0-9a-f]{64}$/);
    rootfs = join(ROOTFS_DIR, (health.body.workImageId as string).slice(7));
    await api.create({ kind: "proxy", id: "px", runId: RUN });
    // A stand-in for the proxy's TLS listener: the wiring probe's answer, so the re-proof can pass.
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
    for (const d of [stateDir, layersDir]) if (d) rmSync(d, { recursive: true, force: true });
    expect(await leftovers(UIDS)).toEqual([]);
  }, 60_000);

  it("keeps a sealed builder's changes and starts a sandbox from them; case P6: in use, a layer is not deleted", async () => {
    await work("b1", { capture: true });
    await setup(
      "b1",
      [
        "mkdir -p /usr/local/share/bw && echo from-setup > /usr/local/share/bw/setup.txt",
        "mkdir -p /home/sandbox/.venv/bin && echo '#!/bin/sh' > /home/sandbox/.venv/bin/python",
        "echo notes > /home/sandbox/notes.txt",
        "chown -R 1:1 /home/sandbox/.venv /home/sandbox/notes.txt",
        // A deleted file of the image (a whiteout) and a directory made anew (opaque).
        "test -f /etc/debian_version && rm /etc/debian_version",
        "rm -rf /usr/share/doc && mkdir /usr/share/doc && echo only > /usr/share/doc/only",
      ].join(" && "),
    );
    expect(await capture("b1")).toMatchObject({ status: 409, body: { code: "not_sealed" } });
    expect((await seal("b1")).status).toBe(200);
    const made = await capture("b1");
    expect(made.status, JSON.stringify(made.body)).toBe(200);
    const digest = made.body.digest as string;
    expect(made.body).toMatchObject({ digest: expect.stringMatching(/^sha256:/), files: expect.any(Number) });
    expect(await capture("b1")).toMatchObject({ status: 200, body: { digest } }); // the same answer
    const tar = readFileSync(join(layersDir, digest.slice(7), "layer.tar"));
    expect(`sha256:${createHash("sha256").update(tar).digest("hex")}`).toBe(digest);
    expect(made.body.bytes).toBe(tar.length);
    expect(await layerNames(digest)).toEqual(
      expect.arrayContaining([
        "usr/local/share/bw/setup.txt",
        "home/sandbox/.venv/bin/python",
        "home/sandbox/notes.txt",
      ]),
    );

    await work("u1", { layer: { digest } });
    const seen = await api.sh(
      "u1",
      "id -u; cat /usr/local/share/bw/setup.txt; ls /usr/share/doc; test -e /etc/debian_version || echo deleted; stat -c '%u %g %n' /home/sandbox/notes.txt /home/sandbox/.venv /home/sandbox/.venv/bin/python /home/sandbox/out",
    );
    expect(seen.stdout.trim().split("\n")).toEqual([
      "1",
      "from-setup",
      "only",
      "deleted",
      "1 1 /home/sandbox/notes.txt",
      "1 1 /home/sandbox/.venv",
      "1 1 /home/sandbox/.venv/bin/python",
      "1 1 /home/sandbox/out",
    ]);
    expect((await api.call("GET", "/v1/layers")).body.layers).toEqual([
      expect.objectContaining({ digest, bytes: tar.length, inUse: 1 }),
    ]);
    // case P6: a live sandbox starts from it.
    expect(await api.call("DELETE", `/v1/layers/${digest}`)).toMatchObject({
      status: 409,
      body: { code: "in_use" },
    });
    expect((await api.call("DELETE", "/v1/sandboxes/u1")).status).toBe(204);
    expect((await api.call("DELETE", `/v1/layers/${digest}`)).status).toBe(204);
    expect((await api.call("DELETE", `/v1/layers/${digest}`)).status).toBe(204);
    expect(existsSync(join(layersDir, digest.slice(7)))).toBe(false);

    // Refused: a sandbox made without capture; one whose execute stage ran a command.
    await work("n1");
    expect((await seal("n1")).status).toBe(200);
    expect(await capture("n1")).toMatchObject({ status: 409, body: { code: "capture_too_late" } });
    await work("c1", { capture: true });
    expect((await seal("c1")).status).toBe(200);
    expect((await api.sh("c1", "true")).exitCode).toBe(0);
    expect(await capture("c1")).toMatchObject({ status: 409, body: { code: "capture_too_late" } });
    // The execute stage's file outside /home: a later sandbox's execute uid differs (plan 8.1).
    await work("o1", { capture: true });
    await setup("o1", "touch /opt/mine && chown 1:1 /opt/mine");
    expect((await seal("o1")).status).toBe(200);
    expect(await capture("o1")).toMatchObject({ status: 422, body: { code: "setup_image_unsupported" } });
    for (const id of ["b1", "n1", "c1", "o1"]) await api.call("DELETE", `/v1/sandboxes/${id}`);
  }, 300_000);

  it("case P4: none of one run's own files is in the layer; a file holding the run CA is refused", async () => {
    await work("b4", { capture: true });
    await setup(
      "b4",
      [
        "echo '10.9.9.9 evil.test' >> /etc/hosts",
        "echo 'nameserver 10.9.9.9' > /etc/resolv.conf",
        "echo planted >> /etc/ssl/certs/ca-certificates.crt",
        "echo planted > /run/benchwright/extra.pem",
        "sed -i 's/^hosts:.*/hosts: dns/' /etc/nsswitch.conf",
        "echo x > /tmp/x && echo x > /var/tmp/x && echo x > /run/x && echo x > /dev/shm/x",
        "echo result > /home/sandbox/out/result",
        "mkdir -p /opt/kept && echo kept > /opt/kept/file",
      ].join(" && "),
    );
    expect((await seal("b4")).status).toBe(200);
    const made = await capture("b4");
    expect(made.status, JSON.stringify(made.body)).toBe(200);
    const names = await layerNames(made.body.digest as string);
    expect(names).toContain("opt/kept/file");
    const run = names.filter(
      (n) =>
        /^etc\/(hosts|resolv\.conf|nsswitch\.conf|ssl\/certs\/ca-certificates\.crt)$/.test(n) ||
        /^(run|tmp|var\/tmp|dev|proc|sys|home\/sandbox\/out)(\/|$)/.test(n),
    );
    expect(run).toEqual([]);

    await work("b5", { capture: true });
    await setup(
      "b5",
      "cp /run/benchwright/run-ca.pem /opt/copy.pem 2>/dev/null || cat > /opt/copy.pem",
      ca.certPem,
    );
    expect((await seal("b5")).status).toBe(200);
    const before = readdirSync(layersDir).sort();
    expect(await capture("b5")).toMatchObject({ status: 422, body: { code: "setup_image_holds_run_files" } });
    expect(readdirSync(layersDir).sort()).toEqual(before); // nothing kept, nothing half made
    for (const id of ["b4", "b5"]) await api.call("DELETE", `/v1/sandboxes/${id}`);
    // The builders' layer tmpfs, mounted in the agent's namespace, went with them.
    const mounts = readFileSync("/proc/self/mountinfo", "utf8");
    expect(mounts).not.toContain(join(stateDir, "sandboxes", "b4"));
    expect((await api.call("DELETE", `/v1/layers/${made.body.digest}`)).status).toBe(204);
  }, 300_000);

  it("case P5: a layer planted into the store binds nothing: execute unprivileged, the wiring the agent's, the re-proof passes", async () => {
    const sh = readFileSync(join(rootfs, "usr/bin/dash"));
    const base = { uid: ROOTFS_UID_BASE, gid: ROOTFS_UID_BASE };
    const dir = (name: string) => ({
      header: { name, type: "directory" as const, size: 0, mode: 0o755, ...base },
    });
    const file = (name: string, body: string | Uint8Array, mode = 0o644, pax?: Record<string, string>) => ({
      header: {
        name,
        size: typeof body === "string" ? Buffer.byteLength(body) : body.length,
        mode,
        ...base,
        ...(pax ? { pax } : {}),
      },
      body,
    });
    // A file capability of most capabilities (permitted and effective; every byte ASCII).
    const capability =
      "\u0001\u0000\u0000\u0002\u007f\u007f\u007f\u007f\u0000\u0000\u0000\u0000\u007f\u0001\u0000\u0000\u0000\u0000\u0000\u0000";
    const digest = await plant([
      dir("etc/"),
      file("etc/ld.so.preload", "/opt/none/preload.so\n"),
      file("etc/nsswitch.conf", "hosts: dns\n"),
      file("etc/hosts", "10.9.9.9 api.example.test\n"),
      dir("etc/ssl/"),
      dir("etc/ssl/certs/"),
      file("etc/ssl/certs/ca-certificates.crt", "planted\n"),
      dir("etc/sysctl.d/"),
      file("etc/sysctl.d/99-userns.conf", "user.max_user_namespaces = 10000\n"),
      dir("usr/"),
      dir("usr/local/"),
      dir("usr/local/bin/"),
      file("usr/local/bin/sush", sh, 0o4755),
      file("usr/local/bin/capsh", sh, 0o755, { "SCHILY.xattr.security.capability": capability }),
    ]);
    const hex = digest.slice(7);
    // What was planted is there: a setuid root binary and a file capability.
    const listed = spawnSync("tar", [
      "-c",
      "-f",
      "-",
      "--xattrs",
      "--xattrs-include=security.*",
      "-C",
      join(layersDir, hex, "root"),
      "usr/local/bin/capsh",
    ]);
    expect(listed.stdout.includes("SCHILY.xattr.security.capability")).toBe(true);

    await work("p5", { layer: { digest } });
    // No setup stage, from birth.
    const early = await api.call("POST", "/v1/sandboxes/p5/exec", { argv: ["true"], stage: "setup" });
    expect(early).toMatchObject({ status: 409, body: { code: "sealed" } });
    expect((await seal("p5")).status).toBe(200);
    const late = await api.call("POST", "/v1/sandboxes/p5/exec", { argv: ["true"], stage: "setup" });
    expect(late).toMatchObject({ status: 409, body: { code: "sealed" } });

    const seen = await api.sh(
      "p5",
      [
        "id -u",
        "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status",
        "stat -c %a /usr/local/bin/sush",
        "/usr/local/bin/sush -c 'id -u'",
        "/usr/local/bin/capsh -c 'grep ^CapEff /proc/self/status'",
        "unshare -U true 2>/dev/null && echo unshared || echo no-userns",
        "grep -c 'api.example.test' /etc/hosts",
        "grep -c planted /etc/ssl/certs/ca-certificates.crt || true",
        "grep '^hosts:' /etc/nsswitch.conf",
      ].join("; "),
    );
    expect(seen.stdout.trim().split("\n")).toEqual([
      "1",
      "CapEff:\t0000000000000000",
      "NoNewPrivs:\t1",
      "4755",
      "1",
      "CapEff:\t0000000000000000",
      "no-userns",
      "1",
      "0",
      expect.stringMatching(/^hosts:\s+files/),
    ]);
    // The hosts file and CA bundle are the agent's: its redirect, the run CA.
    const hosts = readFileSync(join(stateDir, "sandboxes", "p5", "hosts"), "utf8");
    expect((await api.sh("p5", "cat /etc/hosts")).stdout).toBe(hosts);
    expect(hosts).not.toContain("10.9.9.9");
    const bundle = (await api.sh("p5", "cat /etc/ssl/certs/ca-certificates.crt")).stdout;
    expect(bundle).toContain(ca.certPem.trim().split("\n")[1]);
    // The re-proof, in its clean root: the redirect proved, whatever the layer's loader preloads.
    const proof = await api.run("p5", {
      argv: ["bw-wiring"],
      stage: "execute",
      stdin: JSON.stringify(wiringInput("p5")),
    });
    expect(proof.exitCode, proof.stdout + proof.stderr).toBe(0);
    expect(WiringProof.parse(JSON.parse(proof.stdout)).ok).toBe(true);
    await api.call("DELETE", "/v1/sandboxes/p5");
    expect((await api.call("DELETE", `/v1/layers/${digest}`)).status).toBe(204);
  }, 300_000);

  it("case P3: a digest the store does not keep, or a layer whose bytes changed, is never started", async () => {
    const missing = `sha256:${"ab".repeat(32)}`;
    const none = await api.call("POST", "/v1/sandboxes", {
      kind: "work",
      id: "m3",
      runId: RUN,
      proxySandboxId: "px",
      routing: "default",
      layer: { digest: missing },
    });
    expect(none).toMatchObject({ status: 409, body: { code: "setup_image_missing" } });

    const digest = await plant([{ header: { name: "opt/", type: "directory", size: 0, mode: 0o755 } }]);
    const tarPath = join(layersDir, digest.slice(7), "layer.tar");
    const bytes = readFileSync(tarPath);
    bytes[0] = (bytes[0] as number) ^ 0xff;
    writeFileSync(tarPath, bytes);
    const flipped = await api.call("POST", "/v1/sandboxes", {
      kind: "work",
      id: "x3",
      runId: RUN,
      proxySandboxId: "px",
      routing: "default",
      layer: { digest },
    });
    expect(flipped).toMatchObject({ status: 409, body: { code: "setup_image_mismatch" } });
    expect(existsSync(join(layersDir, digest.slice(7)))).toBe(false);
    const listed = (await api.call("GET", "/v1/sandboxes")).body.sandboxes ?? [];
    expect(listed.map((s) => s.id)).not.toContain("x3");
    expect(listed.map((s) => s.id)).not.toContain("m3");
    expect((await api.call("GET", "/v1/layers")).body.layers).toEqual([]);
  }, 120_000);
});
