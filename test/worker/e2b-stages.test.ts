import { CollectManifest } from "@benchwright/shared/contract/bundle";
import type { ExecInfo } from "@benchwright/shared/contract/local-agent";
import { packTar, unpackTar } from "modern-tar";
import { describe, expect, it } from "vitest";
import type { ComputeBackend } from "../../src/broker/backend";
import { shellQuote } from "../../src/broker/e2b/shell";
import { collectArgv, unpackArgv } from "../../src/broker/e2b/stages";
import { randomId } from "../../src/crypto/api-keys";
import type { RecordedE2bRequest } from "../contract/e2b-contract";
import { expectBackendError, proxyOf } from "./backend-fixtures";
import { body, commandOf, e2b, e2bDeployment, homeOf, starts } from "./e2b-fixtures";

// The e2b backend's two stages, in workerd, with the real `e2b` SDK against the E2B CONTRACT
// SERVER (test/contract/e2b-server.ts): bundles in through envd's files API and the REAL bw-unpack,
// artifacts out through the REAL bw-collect and the files API, seal through the REAL exec runner
// (its setup cgroup a real cgroup v2 of this machine where there is one), and the exact commands
// the backend sends for what the contract server only stands in for (bw-wiring, the template's
// scripts). Every process runs as this machine's test user: the users are asserted as recorded.

// A deployment of its own: the other e2b-*.test.ts files, which may run meanwhile, tell their
// requests from these by it.
const { backend, requests, mark } = e2bDeployment("https://stages.contract.test");
const SLOW = { timeout: 90_000 };
// A stand-in certificate: bw-wiring is the contract server's stand-in, which takes any stdin.
const CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBstandin\n-----END CERTIFICATE-----\n";

const line = (words: string[]) => words.map(shellQuote).join(" ");
const stdinOf = (rs: RecordedE2bRequest[], e2bId: string) =>
  rs
    .filter((r) => r.path === "/process.Process/SendInput" && r.sandboxId === e2bId)
    .map((r) => atob(body(r).input.stdin))
    .join("");

async function run(b: ComputeBackend, id: string, script: string, stage: "setup" | "execute" = "execute") {
  const execId = randomId("x_");
  await b.exec(id, { id: execId, argv: ["sh", "-c", script], env: {}, stage, timeoutMs: 60_000 });
  for (let i = 0; i < 30; i++) {
    const info: ExecInfo = await b.poll(id, execId, { waitMs: 2_000 });
    if (info.state === "exited") return info;
  }
  throw new Error(`${script} did not end`);
}

async function tarGz(entries: Parameters<typeof packTar>[0]): Promise<Uint8Array> {
  const tar = await packTar(entries);
  const gz = new Response(new Blob([tar]).stream().pipeThrough(new CompressionStream("gzip")));
  return new Uint8Array(await gz.arrayBuffer());
}
const streamOf = (bytes: Uint8Array) => new Blob([bytes]).stream();

async function untar(stream: ReadableStream<Uint8Array>) {
  const tar = new Uint8Array(
    await new Response(stream.pipeThrough(new DecompressionStream("gzip"))).arrayBuffer(),
  );
  return unpackTar(tar);
}

async function workSandbox(b: ComputeBackend, routing: "default" | "catch-all" = "default") {
  const runId = randomId("run_");
  const { proxyId } = await proxyOf(b, runId);
  const id = randomId("sbx_");
  const info = await b.create({
    kind: "work",
    id,
    runId,
    proxySandboxId: proxyId,
    routing,
    hostsFile: ["api.openai.com"],
  });
  return { id, proxyId, info, home: await homeOf(info.address) };
}

describe("e2b backend: bundles in, artifacts out", SLOW, () => {
  it("putBundle writes the archive with the files API as `user` and bw-unpack unpacks it as `user`", async () => {
    const b = backend();
    const { id, proxyId, info, home } = await workSandbox(b);
    const dir = `${home}/sandbox`;
    const bundle = await tarGz([
      { header: { name: "task_impl.py", size: 14, type: "file" }, body: "print('hello')" },
      { header: { name: "data/", type: "directory", size: 0 } },
      { header: { name: "data/x.txt", size: 3, type: "file" }, body: "xyz" },
    ]);
    const since = await mark();
    expect(await b.putBundle(id, streamOf(bundle), dir)).toEqual({ ok: true, files: 3, bytes: 17 });
    const rs = await requests(since);
    const uploads = rs.filter((r) => r.path === "/files" && r.method === "POST");
    expect(uploads).toHaveLength(1);
    const file = uploads[0]?.query.path as string;
    expect(file).toMatch(/^\.bw-transfer\/bundle-[0-9a-f-]{36}\.tar\.gz$/);
    expect(uploads[0]).toMatchObject({
      sandboxId: info.address,
      accessToken: "ok",
      body: { bytes: bundle.length },
    });
    expect(uploads[0]?.query.username).toBe("user");
    expect(uploads[0]?.headers["content-type"]).toBe("application/octet-stream");
    const [start] = starts(rs, info.address);
    expect(start?.user).toBe("user");
    expect(commandOf(start as RecordedE2bRequest)).toMatch(
      new RegExp(
        `^bw-exec start bw_[0-9a-f]{32} 600000 0 -- ${literal(line(unpackArgv(dir, file, { maxBytes: 536870912, maxFiles: 20000 })))}$`,
      ),
    );
    // The files are there for the execute stage; the archive is gone.
    expect(
      (await run(b, id, `cat ${dir}/task_impl.py ${dir}/data/x.txt; ls -A ${home}/.bw-transfer`)).stdout,
    ).toBe("print('hello')xyz");
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("a bundle that escapes its directory is refused with its code, nothing written outside; H1", async () => {
    // case H1
    const b = backend();
    const { id, proxyId, home } = await workSandbox(b);
    const bad = await tarGz([{ header: { name: "../escaped.txt", size: 1, type: "file" }, body: "x" }]);
    const result = await b.putBundle(id, streamOf(bad), `${home}/sandbox`);
    expect(result).toMatchObject({ ok: false, code: "bundle_path_traversal" });
    expect((await run(b, id, `test -e ${home}/escaped.txt; echo $?`)).stdout).toBe("1\n");
    // A proxy sandbox has no stages.
    await expectBackendError(b.putBundle(proxyId, streamOf(bad), "/tmp"), "invalid_request");
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("collect packs $BW_OUT with bw-collect as `user` and reads it back; a symlink is cut; H4", async () => {
    // case H4
    const b = backend();
    const { id, proxyId, info, home } = await workSandbox(b);
    const out = `${home}/sandbox/out`;
    await run(
      b,
      id,
      `mkdir -p ${out}/sub && printf '{"score":1}' > ${out}/result.json && printf abc > ${out}/sub/b.txt && ln -s /etc/passwd ${out}/link`,
    );
    const since = await mark();
    const stream = await b.collect(id, { dir: out, maxBytes: 1_000_000, maxFiles: 100 });
    const entries = await untar(stream);
    const manifest = CollectManifest.parse(
      JSON.parse(new TextDecoder().decode(entries.find((e) => e.header.name === "manifest.json")?.data)),
    );
    expect(manifest.files.map((f) => [f.path, f.size]).sort()).toEqual([
      ["result.json", 11],
      ["sub/b.txt", 3],
    ]);
    expect(manifest.cut).toEqual([{ path: "link", reason: "symlink", size: null }]);
    expect(new TextDecoder().decode(entries.find((e) => e.header.name === "files/result.json")?.data)).toBe(
      '{"score":1}',
    );
    const rs = await requests(since);
    const [start] = starts(rs, info.address);
    expect(start?.user).toBe("user");
    const read = rs.filter((r) => r.path === "/files" && r.method === "GET");
    expect(read).toHaveLength(1);
    expect(read[0]?.query.username).toBe("user");
    const name = String(read[0]?.query.path).replace(".bw-transfer/", "");
    expect(commandOf(start as RecordedE2bRequest)).toMatch(
      new RegExp(
        `^bw-exec start bw_[0-9a-f]{32} 600000 0 -- ${literal(line(collectArgv(out, name, { maxBytes: 1_000_000, maxFiles: 100 })))}$`,
      ),
    );
    // A missing $BW_OUT is an archive that says so, not an error.
    const none = CollectManifest.parse(
      JSON.parse(
        new TextDecoder().decode(
          (await untar(await b.collect(id, { dir: `${home}/nothing`, maxBytes: 10, maxFiles: 10 }))).find(
            (e) => e.header.name === "manifest.json",
          )?.data,
        ),
      ),
    );
    expect(none).toMatchObject({ missing: true, files: [] });
    await b.destroy(id);
    await b.destroy(proxyId);
  });
});

describe("e2b backend: seal and setHosts", SLOW, () => {
  it("seal kills a double-forked setup daemon, takes root away again, writes the wiring again; G3 G2", async () => {
    // case G3
    const b = backend();
    const { id, proxyId, info, home } = await workSandbox(b);
    // Setup leaves a daemon: out of its session and group, re-parented, still running.
    const pidFile = `${home}/daemon.pid`;
    await run(
      b,
      id,
      `setsid sh -c 'sh -c "echo \\$\\$ > ${pidFile}; exec sleep 300" & exit 0'; sleep 0.3`,
      "setup",
    );
    // Alive: neither gone nor a zombie (whoever reaps here may be slow to), and the same process
    // (its start time: pids are reused quickly on a busy machine).
    const stat = (await run(b, id, `cat /proc/$(cat ${pidFile})/stat`)).stdout.split(" ");
    expect(stat[2]).not.toBe("Z");
    const state = `set -- $(cat /proc/$(cat ${pidFile})/stat 2>/dev/null); [ "$3" != "" ] && [ "$3" != Z ] && [ "\${22}" = ${stat[21]} ] && echo alive || echo gone`;
    expect((await run(b, id, state)).stdout).toBe("alive\n");

    const since = await mark();
    const sealed = await b.seal(id, {
      routing: "default",
      hostsFile: ["api.openai.com", "pypi.org"],
      caCertPem: CA_PEM,
    });
    const rs = await requests(since);
    const commands = starts(rs, info.address).map((r) => [r.user, commandOf(r)]);
    expect(commands.slice(0, 3)).toEqual([
      ["root", "bw-exec seal --sweep"],
      ["root", "bw-drop-root"],
      ["user", "bw-check-user"],
    ]);
    // The wiring's files again, as root, from the copy: exactly this input.
    expect(commands[3]?.[0]).toBe("root");
    expect(commands[3]?.[1]).toMatch(/^bw-exec start bw_[0-9a-f]{32} 60000 \d+ -- bw-wiring reinstall$/);
    expect(JSON.parse(stdinOf(rs, info.address))).toEqual({
      mode: "default",
      proxyAddress: "127.0.0.1",
      hostsFile: ["api.openai.com", "pypi.org"],
      caCertPem: CA_PEM,
    });
    if (e2b.cgroups) {
      // The daemon was in the setup cgroup (a real one here): gone before any execute command.
      expect(sealed.killed).toBeGreaterThanOrEqual(1);
      expect((await run(b, id, state)).stdout).toBe("gone\n");
    }
    // Sealed: no more setup commands; sealing again kills nothing.
    await expectBackendError(
      b.exec(id, { argv: ["true"], env: {}, stage: "setup", timeoutMs: 1_000 }),
      "sealed",
    );
    expect(
      await b.seal(id, { routing: "default", hostsFile: ["api.openai.com"], caCertPem: CA_PEM }),
    ).toEqual({
      killed: 0,
    });
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("catch-all: seal installs the redirect again and the hosts block names only the platform's", async () => {
    const b = backend();
    const { id, proxyId, info } = await workSandbox(b, "catch-all");
    const since = await mark();
    await b.seal(id, { routing: "catch-all", hostsFile: [], caCertPem: CA_PEM });
    const rs = await requests(since);
    const commands = starts(rs, info.address).map((r) => [r.user, commandOf(r)]);
    expect(commands.slice(0, 4)).toEqual([
      ["root", "bw-exec seal --sweep"],
      ["root", "bw-drop-root"],
      ["user", "bw-check-user"],
      ["root", "bw-redirect"],
    ]);
    expect(JSON.parse(stdinOf(rs, info.address))).toEqual({
      mode: "catch-all",
      proxyAddress: "127.0.0.1",
      hostsFile: [],
      caCertPem: CA_PEM,
    });
    // A seal for the other routing, or with no CA, is not this sandbox's.
    await expectBackendError(
      b.seal(id, { routing: "default", hostsFile: [], caCertPem: CA_PEM }),
      "invalid_request",
    );
    await expectBackendError(
      b.seal(id, { routing: "catch-all", hostsFile: [], caCertPem: null }),
      "invalid_request",
    );
    // setHosts has nothing to rewrite under catch-all: nothing is sent.
    const quiet = await mark();
    await b.setHosts(id, ["new.example"]);
    expect(starts(await requests(quiet), info.address)).toEqual([]);
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("setHosts rewrites the hosts block as root, leaving the CA files alone", async () => {
    const b = backend();
    const { id, proxyId, info } = await workSandbox(b);
    const since = await mark();
    await b.setHosts(id, ["api.openai.com", "new.example"]);
    const rs = await requests(since);
    const [start] = starts(rs, info.address);
    expect(start?.user).toBe("root");
    expect(commandOf(start as RecordedE2bRequest)).toMatch(/ -- bw-wiring reinstall$/);
    expect(JSON.parse(stdinOf(rs, info.address))).toEqual({
      mode: "default",
      proxyAddress: "127.0.0.1",
      hostsFile: ["api.openai.com", "new.example"],
      caCertPem: null,
    });
    await b.destroy(id);
    await b.destroy(proxyId);
  });
});

describe("e2b backend: resources", SLOW, () => {
  it("a run larger than the template is refused; within it, execute commands run under its pids", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const big = randomId("sbx_");
    const error = await expectBackendError(
      b.create({
        kind: "work",
        id: big,
        runId,
        proxySandboxId: proxyId,
        routing: "default",
        hostsFile: [],
        resources: { memoryMb: 8192, pids: 256, cpus: 4 },
      }),
      "resources_unavailable",
    );
    expect(error.message).toBe(
      `the run asks for 4 CPUs (it has 2) and 8192 MB of memory (it has 2048), more than the E2B template ${e2b.templates.work} gives; build a larger template (scripts/lib/e2b-templates.ts) or ask for less`,
    );
    await b.destroy(big);

    const id = randomId("sbx_");
    const info = await b.create({
      kind: "work",
      id,
      runId,
      proxySandboxId: proxyId,
      routing: "default",
      hostsFile: [],
      resources: { memoryMb: 1024, pids: 64, cpus: 1 },
    });
    const since = await mark();
    expect((await run(b, id, "echo setup", "setup")).stdout).toBe("setup\n");
    expect((await run(b, id, "echo execute")).stdout).toBe("execute\n");
    const lines = starts(await requests(since), info.address)
      .map(commandOf)
      .filter((c) => c.startsWith("bw-exec start"));
    expect(lines[0]).toMatch(/ 60000 0 --setup -- sh -c 'echo setup'$/);
    expect(lines[1]).toMatch(/ 60000 0 --pids 64 -- sh -c 'echo execute'$/);
    await b.destroy(id);
    await b.destroy(proxyId);
  });
});

/** A string as a RegExp that matches it literally. */
function literal(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
