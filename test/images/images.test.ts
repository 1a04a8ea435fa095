import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { join } from "node:path";
import { ProxyView } from "@benchwright/shared/contract/proxy-view";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildah, buildahMissing, buildahOk, type Output, storageFlags } from "../../local-agent/buildah";
import { megabytes } from "../../scripts/lib/image-publish";
import { buildImages, type ImageBuild, type ImageName } from "../../scripts/lib/images";
import { FakeControlPlane } from "../proxy/control-plane";

// The images of proxy-image/ as `npm run images` builds them (the same function; a built image
// is reused from the layer cache in seconds), and their programs run from the built image: the
// proxy starts against the contract double of the control plane and answers its view, the
// wiring, exec-runner and bridge programs print their usage. A build that fails fails its image's
// tests with the end of the build's output.
//
// The programs run under `buildah run --isolation chroot`: a container of the image with the
// image's own user, environment and /proc, /dev, and no network namespace of its own, so the
// proxy's listeners, its control plane and its view are on this machine's loopback (ports the OS
// picks) and no namespace is made that the unit suite's network tests could meet.
//
// Needs root and buildah; skipped with a message elsewhere, but not under CI, where .ci/run
// installs buildah and a skip would hide a broken install.

const SKIP_REASON = process.env.CI ? null : buildahMissing();
if (SKIP_REASON) console.warn(`image tests skipped: ${SKIP_REASON} (CI runs them as root)`);

const RUN = "run_images";

describe.skipIf(SKIP_REASON !== null)("the images of proxy-image/", () => {
  const builds = new Map<ImageName, ImageBuild>();
  const containers: string[] = [];
  const running: ChildProcess[] = [];

  beforeAll(async () => {
    const { base, images } = await buildImages();
    console.log(`base ${base.ref}: ${base.built ? "built" : "cached"} in ${base.seconds.toFixed(1)} s`);
    for (const image of images) {
      const size = image.ok ? `, ${megabytes(image.bytes)}` : "";
      console.log(
        `image ${image.tag}: ${image.ok ? "built" : "FAILED"} in ${image.seconds.toFixed(1)} s${size}`,
      );
      builds.set(image.name, image);
    }
  });

  afterAll(async () => {
    for (const child of running) child.kill("SIGTERM");
    for (const id of containers) await buildah(["rm", id]);
  });

  /** A new container of the image; fails the test with the build's output if it did not build. */
  async function container(name: ImageName): Promise<string> {
    const build = builds.get(name);
    if (!build) throw new Error(`the ${name} image was not built`);
    if (!build.ok) throw new Error(`the ${name} image did not build:\n${build.error}`);
    const id = (await buildahOk(["from", "--pull=never", build.tag])).trim();
    containers.push(id);
    return id;
  }

  /**
   * How a program runs in its container. `noCapabilities`: an empty bounding set but for the
   * setuid buildah keeps (--cap-drop=all), as every sandbox0 container of the proxy image has
   * (`drop: [ALL]`): exec fails there for a file carrying a capability the set lacks.
   */
  type RunOpts = { user?: string; env?: Record<string, string>; noCapabilities?: boolean };

  const runArgs = (id: string, argv: string[], opts: RunOpts) => [
    "run",
    "--isolation",
    "chroot",
    ...(opts.user ? ["--user", opts.user] : []),
    ...(opts.noCapabilities ? ["--cap-drop=all"] : []),
    ...Object.entries(opts.env ?? {}).flatMap(([k, v]) => ["--env", `${k}=${v}`]),
    id,
    "--",
    ...argv,
  ];

  /** Runs `argv` in the container to its end. */
  const exec = (id: string, argv: string[], opts: RunOpts = {}) => buildah(runArgs(id, argv, opts));

  /**
   * Starts `bw-proxy` in a container of `name` against a fresh control-plane double on loopback,
   * waits for the line it prints after its ready call, then reads its view with `bw-proxy-view`
   * run in the same container. `opts.noCapabilities`: both without capabilities (RunOpts).
   */
  async function proxyAndView(
    name: ImageName,
    env: Record<string, string> = {},
    opts: Pick<RunOpts, "noCapabilities"> = {},
  ) {
    const id = await container(name);
    const cp = new FakeControlPlane(RUN, { version: 3, default: "allow", hosts: [], rules: [] });
    await cp.start();
    try {
      const proxyEnv = { ...cp.proxyEnv("/var/spool/benchwright"), ...env };
      const args = [...(await storageFlags()), ...runArgs(id, ["bw-proxy"], { ...opts, env: proxyEnv })];
      const child = spawn("buildah", args, { stdio: ["ignore", "pipe", "pipe"] });
      running.push(child);
      const readyLine = await new Promise<string>((resolve, reject) => {
        let output = "";
        for (const stream of [child.stdout, child.stderr]) {
          stream.on("data", (chunk: Buffer) => {
            output += chunk;
            const line = output
              .split("\n")
              .slice(0, -1)
              .find((l) => l.includes('"event":"ready"'));
            if (line) resolve(line);
          });
        }
        child.on("exit", (code) =>
          reject(new Error(`bw-proxy exited ${code} before it was ready:\n${output}`)),
        );
      });
      const viewPort = (JSON.parse(readyLine) as { view: number }).view;
      const view = await exec(id, ["bw-proxy-view"], { ...opts, env: { BW_VIEW_PORT: String(viewPort) } });
      child.kill("SIGTERM");
      return { ready: cp.ready, view };
    } finally {
      await cp.close();
    }
  }

  const expectView = (view: Output) => {
    expect(view.code, view.stderr).toBe(0);
    const lines = view.stdout.trim().split("\n");
    expect(lines).toHaveLength(1);
    const parsed = ProxyView.parse(JSON.parse(lines[0] as string));
    expect(parsed).toMatchObject({ runId: RUN, policyVersion: 3, policyState: "ready" });
  };

  /** The exec runner's answer to a call with no operation: its usage refusal, exit 2. */
  const expectRunnerUsage = (r: Output) => {
    expect(r.code).toBe(2);
    expect(JSON.parse(r.stdout)).toEqual({ error: "bad_request", detail: "unknown operation (none)" });
  };

  const expectWiringUsage = (r: Output) => {
    expect(r.code).toBe(2);
    expect(r.stdout).toBe("");
    expect(r.stderr).toContain("bad wiring input: (stdin): not a JSON object");
  };

  // The bridge checks its token before its verb: with one and no verb, it names its verbs.
  const bridgeUsage = (id: string) => exec(id, ["bw-bridge"], { env: { BW_BRIDGE_TOKEN: "t".repeat(32) } });
  const expectBridgeUsage = (r: Output) => {
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("usage: bw-bridge serve|connect");
  };

  describe("proxy (proxy-image/Dockerfile)", () => {
    it("runs the proxy as uid 10001; it starts on loopback and bw-proxy-view prints its view", async () => {
      const id = await container("proxy");
      const uid = await exec(id, ["id", "-u"]);
      expect({ code: uid.code, uid: uid.stdout.trim() }, uid.stderr).toEqual({ code: 0, uid: "10001" });
      // The image's default spool directory, which only the proxy's user may write; no capability,
      // as sandbox0's proxy pod runs it (manifests.ts proxyPod: drop ALL).
      const { ready, view } = await proxyAndView("proxy", {}, { noCapabilities: true });
      expect(ready?.policyVersion).toBe(3);
      expect(ready?.caCertPem).toContain("BEGIN CERTIFICATE");
      expectView(view);
    });

    it("bw-wiring prints its usage, run as the sealer runs it: root with no capability", async () => {
      // bw-init hosts runs bw-wiring in the bw-seal container (root; drop ALL, add KILL).
      expectWiringUsage(
        await exec(await container("proxy"), ["bw-wiring"], { user: "0", noCapabilities: true }),
      );
    });

    it("is under 150 MB: node, the programs and what they load, over no distribution", async () => {
      const id = await container("proxy"); // fails here if it did not build
      const build = builds.get("proxy") as ImageBuild & { ok: true };
      expect(build.bytes).toBeGreaterThan(100e6); // node itself is over 100 MB
      expect(build.bytes).toBeLessThan(150e6);
      expect((await exec(id, ["sh", "-c", "test -e /usr/bin/apt-get || test -e /usr/bin/dpkg"])).code).toBe(
        1,
      );
    });

    it("node carries no file capability: it runs where every capability is dropped", async () => {
      // The kernel refuses to exec a file whose capability is outside the bounding set, and every
      // sandbox0 container of this image drops ALL: a capability on node would stop the proxy,
      // bw-init tools' copy and the sealer's bw-wiring. getcap reads the file from the host.
      const id = await container("proxy");
      const root = (await buildahOk(["mount", id])).trim();
      expect(execFileSync("getcap", [join(root, "usr/local/bin/node")], { encoding: "utf8" }).trim()).toBe(
        "",
      );
      const node = await exec(id, ["node", "-p", "process.getuid()"], { noCapabilities: true });
      expect({ code: node.code, uid: node.stdout.trim() }, node.stderr).toEqual({ code: 0, uid: "10001" });
    });

    it("loads koffi's binary for the image's own libc, as the proxy does for a DNAT'd socket", async () => {
      // original-dst.ts loads koffi lazily and fails closed without it (every direct-listener
      // connection refused): a missing or wrong-architecture binary would pass every other test.
      const id = await container("proxy");
      const probe = [
        'const koffi = require("/opt/benchwright/node_modules/koffi");',
        'const libc = koffi.load("libc.so.6");',
        'const getsockopt = libc.func("int getsockopt(int fd, int level, int name, _Out_ uint8_t *val, _Inout_ uint32_t *len)");',
        // fd 0 is not a socket here: the call itself must run and fail with -1 (ENOTSOCK).
        "console.log(JSON.stringify({ pid: libc.func('int getpid()')() === process.pid, rc: getsockopt(0, 0, 80, Buffer.alloc(16), [16]) }));",
      ].join("\n");
      const r = await exec(id, ["node", "-e", probe]);
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout)).toEqual({ pid: true, rc: -1 });
    });

    it("bw-init tools lays out node and the exec runner, which print their usage from /bw/tools", async () => {
      const id = await container("proxy");
      // The pod's emptyDir volumes, writable by its uid; bw-init tools runs as that uid, with no
      // capability (manifests.ts toolsInit).
      const volumes = await exec(
        id,
        ["sh", "-c", "mkdir -p /bw/tools /bw/run && chown 10001 /bw/tools /bw/run"],
        {
          user: "0",
        },
      );
      expect(volumes.code, volumes.stderr).toBe(0);
      const init = await exec(id, ["bw-init", "tools"], { noCapabilities: true });
      expect(init.code, init.stderr).toBe(0);
      // Node through its own loader and libraries, as in a work image that has neither.
      const node = await exec(id, ["/bw/tools/bin/node", "-p", "process.version"], { noCapabilities: true });
      expect(node.stdout.trim(), node.stderr).toMatch(/^v24\./);
      expectRunnerUsage(await exec(id, ["/bw/tools/bin/bw-exec"], { user: "0" }));
      expectWiringUsage(await exec(id, ["/bw/tools/bin/bw-wiring"], { user: "0" }));
      expect((await exec(id, ["bw-init"], { user: "0" })).stderr).toContain("usage: bw-init tools");
    });
  });

  describe("e2b proxy (proxy-image/e2b.Dockerfile)", () => {
    it("the proxy starts on loopback and bw-proxy-view prints its view", async () => {
      // The spool the e2b backend gives the proxy (src/coordinator/steps/proxy.ts).
      const { ready, view } = await proxyAndView("e2b-proxy", { BW_SPOOL_DIR: "/tmp/benchwright-spool" });
      expect(ready?.policyVersion).toBe(3);
      expectView(view);
    });

    it("bw-exec and bw-bridge print their usage", async () => {
      const id = await container("e2b-proxy");
      expectRunnerUsage(await exec(id, ["bw-exec"]));
      expectBridgeUsage(await bridgeUsage(id));
    });
  });

  describe("e2b work (proxy-image/e2b-work.Dockerfile)", () => {
    it("bw-wiring, bw-exec and bw-bridge print their usage", async () => {
      const id = await container("e2b-work");
      expectWiringUsage(await exec(id, ["bw-wiring"]));
      expectRunnerUsage(await exec(id, ["bw-exec"]));
      expectBridgeUsage(await bridgeUsage(id));
    });

    it("has the heredoc scripts, executable, and the agent's toolchain", async () => {
      const id = await container("e2b-work");
      const check = await exec(id, ["bw-check-user"]);
      expect(check).toMatchObject({ code: 1, stdout: "the execute user is root\n" });
      const tools = await exec(id, [
        "sh",
        "-c",
        "test -x /usr/local/bin/bw-drop-root && test -x /usr/local/bin/bw-redirect && python3 --version && python3 -c 'import requests, httpx' && git --version && curl --version && iptables --version",
      ]);
      expect(tools.code, tools.stderr).toBe(0);
    });
  });
});
