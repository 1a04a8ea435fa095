import { spawnSync } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { inArray } from "drizzle-orm";
import { expect, inject, it } from "vitest";
import { nodeDb } from "../../scripts/lib/neon-node";
import { runs } from "../../src/db/schema";
import { until } from "../until";
import { type Api, demoVault, describeE2e, newUser, stdoutOf, type TraceEvent, waitForEnd } from "./harness";
import { scanTree, setupImageRows, setupRanIn } from "./setup-images";

// Setup images end to end (issue 34), on the local backend's real parts: the host agent captures
// a builder's setup as a layer in its store, the broker arbitrates by key in `setup_images`, the
// coordinator starts the other sandboxes from it. Whether a setup ran is read from outside the
// sandboxes: each setup fetches a path of its own from the demo API host (the vault's canary is
// its key), so the upstream counts the setups that ran; the trace says which sandbox built and
// which started from the image. One stack for the file, its layers bounded at 1 MiB
// (SETUP_IMAGE_MAX_LAYER_MB) so that one task can pass the bound; every setup here is small.

type Run = { id: string; status: string; reason: string; notes: { code: string; text: string }[] } & {
  trace: TraceEvent[];
};

const MAX_LAYER_MB = 1;

describeE2e(
  "setup images on the local backend",
  {
    start: {
      name: "bwt-e2i",
      index: 83,
      workerVars: { SETUP_IMAGE_MAX_LAYER_MB: String(MAX_LAYER_MB) },
    },
  },
  (e) => {
    /** Every run this file launched (the canary walk looks for each one's CA). */
    const launchedIds: string[] = [];
    /** Launches a run and waits for its end. */
    const launch = async (api: Api, spec: Record<string, unknown>): Promise<Run> => {
      const launched = await api.call("POST", "/v1/runs", spec);
      expect(launched.status, launched.text).toBe(202);
      launchedIds.push(launched.json.id);
      return (await waitForEnd(api, launched.json.id, 240_000)) as Run;
    };
    const completed = (run: Run) =>
      expect(run, JSON.stringify(run.trace, null, 1).slice(0, 20_000)).toMatchObject({
        status: "finished",
        reason: "completed",
      });
    /** How many setups fetched /setup/<tag> from the API host (through the proxy, so far). */
    const setups = (tag: string) =>
      e.upstream.seen.filter((s) => s.host === "api.demo.test" && s.path === `/setup/${tag}`).length;
    /** The setup that fetches /setup/<tag> and keeps the answer. */
    const fetchInto = (tag: string, dir: string) =>
      `mkdir -p ${dir} && curl -sf https://api.demo.test/setup/${tag} -o ${dir}/api.json`;
    const layerDirs = () => readdirSync(e.layersDir).filter((n) => /^[0-9a-f]{64}$/.test(n));
    const dirOf = (digest: string) => join(e.layersDir, digest.replace(/^sha256:/, ""));
    /** [name, digest, built by run, built now] of each sandbox made from an image, by name. */
    const usedBy = (run: Run) =>
      setupImageRows(run)
        .used.map((u) => [u.name, u.digest, u.builtByRunId, u.builtNow])
        .sort();
    const listed = async (api: Api) => (await api.call("GET", "/v1/setup-images")).json.setupImages;

    async function uploadBundle(api: Api, files: Record<string, string>): Promise<string> {
      const dir = mkdtempSync(join(tmpdir(), "bw-simg-bundle-"));
      for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text);
      const tar = spawnSync("tar", ["-cz", "-C", dir, "."]);
      rmSync(dir, { recursive: true, force: true });
      const res = await fetch(`${e.stack.apiUrl}/v1/bundles`, {
        method: "POST",
        headers: { authorization: `Bearer ${api.key}`, "content-type": "application/gzip" },
        body: new Uint8Array(tar.stdout),
      });
      expect(res.status).toBeLessThan(300);
      return ((await res.json()) as { sha256: string }).sha256;
    }

    // One environment for P1 and the rebuild: its spec, and what its runs built.
    let api: Api;
    let spec: Record<string, unknown>;
    let first: Run;
    const SHOW =
      "cat data.txt /opt/p1/data.txt /home/sandbox/state; grep -c '\"keyMatches\":true' /opt/p1/api.json";

    // case P1
    it("case P1: run 2 of the same spec starts every sandbox from run 1's image; setup runs 0 times", async () => {
      api = await newUser(e.stack.apiUrl);
      await demoVault(api, e.canary);
      for (const name of ["eval-one", "eval-two"]) {
        const model = await api.call("POST", "/v1/vault/models", {
          name,
          provider: "openai-compatible",
          baseUrl: "https://api.demo.test/v1",
          secret: "DEMO_KEY",
          upstreamModel: "demo-1",
        });
        expect(model.status, model.text).toBeLessThan(300);
      }
      const bundle = await uploadBundle(api, { "data.txt": "bundle-one\n" });
      spec = {
        bundle,
        setup: [`${fetchInto("p1", "/opt/p1")} && cp data.txt /opt/p1/ && echo kept > /home/sandbox/state`],
        commands: [SHOW],
        tasks: [{ name: "t1", commands: [SHOW] }],
        model: "eval-one",
      };
      const expected = "bundle-one\nbundle-one\nkept\n1\n";

      // Run 1: the work sandbox builds; its task starts from the fresh image.
      first = await launch(api, spec);
      completed(first);
      const one = setupImageRows(first);
      expect(one.built.map((b) => b.name)).toEqual(["work"]);
      const digest = one.built[0]?.digest as string;
      expect(usedBy(first)).toEqual([["t1", digest, first.id, true]]);
      expect(setupRanIn(first)).toEqual(["work"]);
      expect(setups("p1")).toBe(1);
      for (const name of ["work", "t1"]) expect(stdoutOf(first, name)).toBe(expected);
      expect(existsSync(join(dirOf(digest), ".complete"))).toBe(true);

      // Run 2, the same spec: both sandboxes from run 1's image, no setup anywhere.
      const second = await launch(api, spec);
      completed(second);
      expect(setupImageRows(second).built).toEqual([]);
      expect(usedBy(second)).toEqual([
        ["t1", digest, first.id, false],
        ["work", digest, first.id, false],
      ]);
      for (const u of setupImageRows(second).used) {
        expect(u.text).toBe(
          `${u.name} starts from setup image ${digest}, built by run ${first.id}: no setup stage.`,
        );
      }
      expect(setupRanIn(second)).toEqual([]);
      expect(JSON.stringify(second.trace)).not.toContain('"stage":"bundle"');
      expect(setups("p1")).toBe(1);
      // What setup made (the bundle's file and the API's answer) is there all the same.
      for (const name of ["work", "t1"]) expect(stdoutOf(second, name)).toBe(expected);
      expect(await listed(api)).toEqual([
        expect.objectContaining({
          status: "built",
          digest,
          builtBy: first.id,
          lastUsedAt: expect.any(String),
          bundle,
          setup: spec.setup,
          resources: { memoryMb: 2048, pids: 1024 },
        }),
      ]);
    }, 600_000);

    // case P1
    it("case P1: a changed setup, bundle or memoryMb builds a new image; a changed cpus or model does not", async () => {
      const d1 = setupImageRows(first).built[0]?.digest as string;
      const t2 = { name: "t2", setup: ["echo extra > /opt/p1/extra"], commands: ["cat /opt/p1/extra"] };
      // cpus and model changed: the same image; a task with a setup of its own: its own image.
      const three = await launch(api, {
        ...spec,
        model: "eval-two",
        resources: { cpus: 0.5 },
        tasks: [...(spec.tasks as unknown[]), t2],
      });
      completed(three);
      expect(usedBy(three)).toEqual([
        ["t1", d1, first.id, false],
        ["work", d1, first.id, false],
      ]);
      expect(setupImageRows(three).built.map((b) => b.name)).toEqual(["t2"]);
      expect(setupRanIn(three)).toEqual(["t2"]);
      expect(stdoutOf(three, "t2")).toBe("extra\n");
      expect(setups("p1")).toBe(2);

      // memoryMb changed: built now. Beside it, case P6: a task whose setup leaves 2 MiB passes
      // the 1 MiB bound; its layer is not kept, and the run completes.
      const big = {
        name: "big",
        setup: ["head -c 2097152 /dev/urandom > /opt/p1/big.bin"],
        commands: ["stat -c %s /opt/p1/big.bin"],
      };
      const layersBefore = layerDirs();
      const four = await launch(api, {
        ...spec,
        resources: { memoryMb: 1024 },
        tasks: [...(spec.tasks as unknown[]), big],
      });
      completed(four);
      const built4 = setupImageRows(four).built;
      expect(built4.map((b) => b.name)).toEqual(["work"]);
      const d4 = built4[0]?.digest as string;
      expect(d4).not.toBe(d1);
      expect(usedBy(four)).toEqual([["t1", d4, four.id, true]]);
      expect(setupRanIn(four)).toEqual(["big", "work"]);
      expect(stdoutOf(four, "big")).toBe("2097152\n");
      const notKept = four.notes.filter((n) => n.code === "setup_image_not_kept");
      expect(notKept).toHaveLength(1);
      expect(notKept[0]?.text).toContain(
        "The setup of big was not kept as a setup image (setup_image_too_large:",
      );
      expect(notKept[0]?.text).toContain(`larger than ${MAX_LAYER_MB} MiB (SETUP_IMAGE_MAX_LAYER_MB)`);
      // Of the two setups of that run, only the work sandbox's layer was stored.
      expect(layerDirs().filter((d) => !layersBefore.includes(d))).toEqual([d4.slice(7)]);
      expect(setups("p1")).toBe(4);

      // The bundle changed: built now.
      const five = await launch(api, {
        ...spec,
        bundle: await uploadBundle(api, { "data.txt": "bundle-two\n" }),
      });
      completed(five);
      const built5 = setupImageRows(five).built;
      expect(built5.map((b) => b.name)).toEqual(["work"]);
      const d5 = built5[0]?.digest as string;
      expect([d1, d4]).not.toContain(d5);
      expect(usedBy(five)).toEqual([["t1", d5, five.id, true]]);
      expect(stdoutOf(five, "t1")).toBe("bundle-two\nbundle-two\nkept\n1\n");
      expect(setups("p1")).toBe(5);

      // Four images in the environment (big's is not one of them), each found by its own key.
      const images = await listed(api);
      expect(images.map((i: { digest: string }) => i.digest).sort()).toEqual(
        [d1, d4, d5, setupImageRows(three).built[0]?.digest].sort(),
      );
      expect(new Set(images.map((i: { key: string }) => i.key)).size).toBe(4);
    }, 900_000);

    it('setupImage "rebuild" builds anew and replaces the digest; DELETE and the reaper remove the layer', async () => {
      const d1 = setupImageRows(first).built[0]?.digest as string;
      const rebuilt = await launch(api, { ...spec, setupImage: "rebuild" });
      completed(rebuilt);
      const built = setupImageRows(rebuilt).built;
      expect(built.map((b) => b.name)).toEqual(["work"]);
      const d6 = built[0]?.digest as string;
      expect(d6).not.toBe(d1);
      // Its task waited for the fresh build rather than start from the old image.
      expect(usedBy(rebuilt)).toEqual([["t1", d6, rebuilt.id, true]]);
      expect(setups("p1")).toBe(6);
      const row = (await listed(api)).find(
        (i: { setup: string[]; resources: { memoryMb: number }; bundle: string }) =>
          JSON.stringify([i.setup, i.bundle, i.resources.memoryMb]) ===
          JSON.stringify([spec.setup, spec.bundle, 2048]),
      );
      expect(row).toMatchObject({ status: "built", digest: d6, builtBy: rebuilt.id });

      const dropped = await api.call("DELETE", `/v1/setup-images/${row.key}`);
      expect(dropped.status, dropped.text).toBe(204);
      expect((await listed(api)).find((i: { key: string }) => i.key === row.key)).toMatchObject({
        status: "dropping",
      });
      expect(existsSync(dirOf(d6))).toBe(true);
      // The reaper (the cron trigger, as `wrangler dev` fires it) removes the layer, then the row.
      await until(
        "the reaper to drop the layer and its row",
        async () => {
          const swept = await fetch(
            `${e.stack.apiUrl}/__scheduled?cron=${encodeURIComponent("*/5 * * * *")}`,
          );
          expect(swept.status).toBe(200);
          const gone = !(await listed(api)).some((i: { key: string }) => i.key === row.key);
          return gone && !existsSync(dirOf(d6));
        },
        60_000,
        1_000,
      );
      // The next run with that key builds it again.
      const again = await launch(api, spec);
      completed(again);
      expect(setupImageRows(again).built.map((b) => b.name)).toEqual(["work"]);
    }, 600_000);

    // case P6
    it("case P6: a failed setup keeps nothing; two runs at once build each key once; a missing or changed layer is rebuilt", async () => {
      const six = await newUser(e.stack.apiUrl);
      await demoVault(six, e.canary);
      const before = readdirSync(e.layersDir);
      const failed = await launch(six, {
        setup: [`${fetchInto("p6-fail", "/opt/p6")} && echo half > /opt/p6/half`, "exit 1"],
        commands: ["echo must-not-run"],
      });
      expect(failed).toMatchObject({ status: "stopped", reason: "setup_failed" });
      expect(setups("p6-fail")).toBe(1);
      expect(await listed(six)).toEqual([]);
      expect(readdirSync(e.layersDir).sort()).toEqual([...before].sort());
      expect(setupImageRows(failed).built).toEqual([]);

      // Two runs launched together, two keys each (the work sandbox's setup, and the task's own
      // on top of it): each key is captured once, by one run; the other run's sandbox of that key
      // starts from it ("built by run …"), after waiting for it if it was still building.
      const show = "cat /opt/p6/api.json | grep -c keyMatches; cat /opt/p6/own 2>/dev/null || true";
      const pair = {
        setup: [fetchInto("p6", "/opt/p6")],
        commands: [show],
        tasks: [{ name: "t", setup: ["echo own > /opt/p6/own"], commands: [show] }],
      };
      const layersBefore = layerDirs();
      const both = await Promise.all([launch(six, pair), launch(six, pair)]);
      for (const run of both) completed(run);
      const captures = both.flatMap((run) => setupImageRows(run).built.map((b) => ({ run: run.id, ...b })));
      expect(captures.map((c) => c.name).sort()).toEqual(["t", "work"]);
      for (const c of captures) {
        for (const run of both) {
          const used = setupImageRows(run).used.filter((u) => u.name === c.name);
          if (run.id === c.run) expect(used).toEqual([]);
          else expect(used).toEqual([expect.objectContaining({ digest: c.digest, builtByRunId: c.run })]);
        }
      }
      expect(setups("p6")).toBe(2);
      expect(
        layerDirs()
          .filter((d) => !layersBefore.includes(d))
          .sort(),
      ).toEqual(captures.map((c) => c.digest.slice(7)).sort());
      const agentCaptures = e.logs.filter(
        (l) => l.includes('"event":"layer_captured"') && both.some((r) => l.includes(r.id)),
      );
      expect(agentCaptures).toHaveLength(2);
      expect((await listed(six)).map((i: { digest: string }) => i.digest).sort()).toEqual(
        captures.map((c) => c.digest).sort(),
      );
      for (const run of both) expect(stdoutOf(run, "t")).toBe("1\nown\n");

      // The work image's layer deleted, the task's layer.tar changed by one byte: the next run
      // rebuilds both (the trace says why) and never starts from either.
      const work = captures.find((c) => c.name === "work") as (typeof captures)[number];
      const task = captures.find((c) => c.name === "t") as (typeof captures)[number];
      rmSync(dirOf(work.digest), { recursive: true });
      const tar = join(dirOf(task.digest), "layer.tar");
      const bytes = readFileSync(tar);
      bytes[600] = (bytes[600] as number) ^ 0x01;
      writeFileSync(tar, bytes);
      const third = await launch(six, pair);
      completed(third);
      expect(usedBy(third)).toEqual([]);
      expect(
        setupImageRows(third)
          .built.map((b) => b.name)
          .sort(),
      ).toEqual(["t", "work"]);
      expect(setupRanIn(third)).toEqual(["t", "work"]);
      expect(setups("p6")).toBe(4);
      // The run's notes keep one per code; the trace says why for each sandbox.
      expect(third.notes.filter((n) => n.code === "setup_image_rebuilt")).toHaveLength(1);
      const rebuilt = setupImageRows(third).other;
      expect(rebuilt).toHaveLength(2);
      expect(rebuilt).toContainEqual(
        expect.stringMatching(
          new RegExp(`^The setup image ${work.digest} for work was missing \\(setup_image_missing: `),
        ),
      );
      expect(rebuilt).toContainEqual(
        expect.stringMatching(
          new RegExp(`^The setup image ${task.digest} for t was missing \\(setup_image_mismatch: `),
        ),
      );
      // The changed layer is gone from the store; the new ones are there and listed.
      expect(existsSync(dirOf(task.digest))).toBe(false);
      const fresh = setupImageRows(third).built.map((b) => b.digest);
      for (const d of fresh) expect(existsSync(join(dirOf(d), ".complete"))).toBe(true);
      expect((await listed(six)).map((i: { digest: string }) => i.digest).sort()).toEqual([...fresh].sort());
      expect(stdoutOf(third, "t")).toBe("1\nown\n");
    }, 900_000);

    // case P4, case P5
    it("case P4, case P5: a hostile setup: its layer keeps no run's files, no setuid bit, no capability; a task from it is bound as a fresh one", async () => {
      const hostile = await newUser(e.stack.apiUrl);
      await demoVault(hostile, e.canary);
      // Markers assembled at run time, so no command line holds one: a scan finds only a file's.
      const setup = [
        'M=bw; M="$M"p4',
        "sed 's/^/hosts> /' /etc/hosts",
        // The vault canary's host: its answer (the proxy injected the key) kept in the layer.
        fetchInto("p4", "/opt/p4"),
        'echo "$M-kept" > /opt/p4/kept',
        // The run's own files: wiring, resolver, name service, CA, $BW_OUT, /tmp, /run.
        `echo "${e.upstream.address} blocked.demo.test # $M-hosts" >> /etc/hosts`,
        'echo "nameserver 10.9.9.9 # $M-resolv" >> /etc/resolv.conf',
        'printf "hosts: dns files # %s-nss\\n" "$M" > /etc/nsswitch.conf',
        'echo "$M-ca" >> /etc/ssl/certs/ca-certificates.crt',
        'find /run/benchwright -type f 2>/dev/null | while read -r f; do echo "$M-runca" >> "$f"; done; true',
        'mkdir -p /home/sandbox/out && echo "$M-out" > /home/sandbox/out/p4.txt',
        'echo "$M-tmp" > /tmp/p4; echo "$M-vartmp" > /var/tmp/p4; echo "$M-run" > /run/p4; echo "$M-shm" > /dev/shm/p4',
        // case P5: a setuid root shell, a file capability, a raised namespace limit, a preload.
        "cp /bin/sh /usr/local/bin/sush && chmod 4755 /usr/local/bin/sush && stat -c 'sush %a' /usr/local/bin/sush",
        "cp /bin/sh /usr/local/bin/capsh",
        `python3 -c "import os, struct; os.setxattr('/usr/local/bin/capsh', 'security.capability', struct.pack('<IIIII', 0x02000001, 0xffffffff, 0, 0x1ff, 0)); print('capability', len(os.getxattr('/usr/local/bin/capsh', 'security.capability')))"`,
        "mkdir -p /etc/sysctl.d && echo 'user.max_user_namespaces = 100000' > /etc/sysctl.d/99-userns.conf",
        "echo 100000 > /proc/sys/user/max_user_namespaces 2>/dev/null; true",
        "echo /opt/none/preload.so > /etc/ld.so.preload",
      ].join("\n");
      const check = [
        "echo uid=$(id -u)",
        "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status",
        "stat -c 'mode %a' /usr/local/bin/sush",
        "echo sush-uid=$(/usr/local/bin/sush -p -c 'id -u')",
        "/usr/local/bin/capsh -c 'grep ^CapEff /proc/self/status' | sed 's/^/capsh /'",
        "unshare -U true 2>/dev/null && echo unshared || echo no-userns",
        "echo planted=$(cat /etc/hosts /etc/resolv.conf /etc/nsswitch.conf /etc/ssl/certs/ca-certificates.crt | grep -c bwp4)",
        "grep '^hosts:' /etc/nsswitch.conf",
        "echo kept=$(cat /opt/p4/kept)",
        "curl -sk -o /dev/null -w 'blocked %{http_code}\\n' https://blocked.demo.test/",
      ].join("; ");
      const run = await launch(hostile, {
        setup: [setup],
        commands: ["echo work-done"],
        tasks: [{ name: "t", commands: [check] }],
      });
      completed(run);
      const work = stdoutOf(run, "work");
      // The setup did plant them (a layer of nothing would prove nothing).
      expect(work).toContain("sush 4755");
      expect(work).toMatch(/^capability \d+$/m);
      const images = setupImageRows(run);
      expect(images.built.map((b) => b.name)).toEqual(["work"]);
      const digest = images.built[0]?.digest as string;
      expect(usedBy(run)).toEqual([["t", digest, run.id, true]]);

      // case P5: the layer keeps no setuid bit and no capability; what it keeps of /etc is the
      // setup's own (ld.so.preload, sysctl.d), never the wiring's files.
      const dir = dirOf(digest);
      const listing = spawnSync("tar", ["-tv", "--numeric-owner", "-f", join(dir, "layer.tar")], {
        encoding: "utf8",
      }).stdout;
      const entries = listing.trim().split("\n");
      expect(entries.find((l) => l.endsWith(" usr/local/bin/sush"))).toMatch(/^-rwxr-xr-x /);
      expect(entries.filter((l) => /^.{3}[sS]|^.{6}[sS]/.test(l))).toEqual([]);
      const names = entries.map((l) => l.split(/\s+/).slice(5).join(" "));
      expect(names).toContain("etc/ld.so.preload");
      for (const excluded of [
        "etc/hosts",
        "etc/resolv.conf",
        "etc/nsswitch.conf",
        "etc/ssl/certs/ca-certificates.crt",
      ]) {
        expect(names).not.toContain(excluded);
      }
      expect(names.filter((n) => /^(tmp|var\/tmp|run|dev|proc|sys|home\/sandbox\/out)\/./.test(n))).toEqual(
        [],
      );
      expect(readFileSync(join(dir, "layer.tar")).toString("latin1")).not.toContain("security.capability");
      const setuid = spawnSync("find", [join(dir, "root"), "-perm", "/6000"], { encoding: "utf8" });
      expect(setuid.stdout).toBe("");
      const caps = spawnSync("getcap", ["-r", join(dir, "root")], { encoding: "utf8" });
      expect(caps.stdout).toBe("");

      // case P5: the task started from it is bound as a fresh sandbox: the wiring proved before
      // its first command, the commands unprivileged, the planted files change nothing.
      const proved = run.trace.findIndex(
        (t) => t.kind === "proxy" && t.detail?.name === "t" && t.detail?.installed === true,
      );
      expect(run.trace[proved]?.detail.proof.ok).toBe(true);
      const firstCommand = run.trace.findIndex((t) => t.kind === "output" && t.detail?.name === "t");
      expect(proved).toBeGreaterThanOrEqual(0);
      expect(proved).toBeLessThan(firstCommand);
      expect(setupRanIn(run)).toEqual(["work"]);
      const task = stdoutOf(run, "t");
      expect(task.trim().split("\n")).toEqual([
        expect.stringMatching(/^uid=[1-9]\d*$/),
        "CapEff:\t0000000000000000",
        "NoNewPrivs:\t1",
        "mode 755",
        expect.stringMatching(/^sush-uid=[1-9]\d*$/),
        "capsh CapEff:\t0000000000000000",
        "no-userns",
        "planted=0",
        expect.stringMatching(/^hosts:\s+files/),
        "kept=bwp4-kept",
        "blocked 403",
      ]);
      expect(e.upstream.seen.filter((s) => s.host === "blocked.demo.test")).toEqual([]);

      // case P4: the canary walk over the agent's whole store (every layer of this file's runs,
      // layer.tar and root/ alike): no vault canary, no run CA, no wiring hosts block, nothing the
      // setup wrote where a run's own files go.
      const { db, pool } = nodeDb(inject("databaseUrl"));
      const cas = await db.select({ ca: runs.caCertPem }).from(runs).where(inArray(runs.id, launchedIds));
      await pool.end();
      // Every run's CA of this file (each run has its own), by the lines of its PEM body.
      const caLines = cas.flatMap((r) =>
        (r.ca ?? "").split("\n").filter((l) => /^[A-Za-z0-9+/]{64}$/.test(l)),
      );
      expect(cas.filter((r) => r.ca).length).toBe(launchedIds.length);
      const hostsBlock = work
        .split("\n")
        .filter((l) => l.startsWith("hosts> ") && l.includes(".demo.test"))
        .map((l) => l.slice("hosts> ".length));
      expect(hostsBlock.length).toBeGreaterThan(0);
      const markers = ["hosts", "resolv", "nss", "ca", "runca", "out", "tmp", "vartmp", "run", "shm"].map(
        (m) => `bwp4-${m}`,
      );
      const needles = [e.canary, ...caLines, ...hostsBlock, ...markers];
      const scan = scanTree(e.layersDir, [...needles, "bwp4-kept"]);
      expect(scan.hits.filter((h) => h.needle !== "bwp4-kept")).toEqual([]);
      // The walk reads what the store keeps: the one file the setup meant to keep is found, in
      // the layer's archive and in its overlay tree.
      expect(
        scan.hits
          .filter((h) => h.needle === "bwp4-kept")
          .map((h) => h.path)
          .sort(),
      ).toEqual([`${digest.slice(7)}/layer.tar`, `${digest.slice(7)}/root/opt/p4/kept`]);
      expect(scan.files).toBeGreaterThan(10);
    }, 600_000);

    // case P4
    it("case P4: the directory walk finds a needle in a nested binary file, a link's target and a name", () => {
      const dir = mkdtempSync(join(tmpdir(), "bw-scan-"));
      try {
        const needle = `needle-${Date.now()}`;
        mkdirSync(join(dir, "a", "b"), { recursive: true });
        writeFileSync(
          join(dir, "a", "b", "blob"),
          Buffer.concat([Buffer.from([0, 255, 7]), Buffer.from(needle), Buffer.from([0])]),
        );
        symlinkSync(`/nowhere/${needle}`, join(dir, "a", "link"));
        writeFileSync(join(dir, `named-${needle}`), "");
        writeFileSync(join(dir, "clean"), "nothing here");
        const scan = scanTree(dir, [needle]);
        expect(scan.hits.map((h) => h.path).sort()).toEqual(["a/b/blob", "a/link", `named-${needle}`]);
        expect(scan.files).toBe(3);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });
  },
);
