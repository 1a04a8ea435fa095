import { tarGzEntries } from "@benchwright/shared/archive/entries";
import { CollectManifest } from "@benchwright/shared/contract/bundle";
import { describe, expect, it } from "vitest";
import type { ComputeBackend } from "../../src/broker/backend";
import { objectName } from "../../src/broker/kubernetes/manifests";
import { randomId } from "../../src/crypto/api-keys";
import type { RecordedRequest } from "../contract/kubernetes-contract";
import { file, streamOf, tarGz } from "./archives";
import { expectBackendError } from "./backend-fixtures";
import { api, contractOptions, line, newNs, proxyAndWorkIn, recorded, run } from "./sandbox0-fixtures";

// Bundles into and artifacts out of a sandbox0 work pod: the REAL bw-unpack and bw-collect over
// pods/exec (binary stdin closed by v5's CLOSE, binary stdout), and the v4 refusal.

describe("sandbox0 bundles in, artifacts out", () => {
  async function workPodIn(ns: string) {
    const { b, id, proxyId } = await proxyAndWorkIn(ns);
    // The pod's directory on this machine (the contract server runs the programs here).
    const pwd = await run(b, id, { argv: ["pwd"], stage: "execute", timeoutMs: 10_000 });
    return { b, id, proxyId, root: pwd.stdout.trim() };
  }
  const sh = (b: ComputeBackend, id: string, script: string) =>
    run(b, id, { argv: ["sh", "-c", script], stage: "execute", timeoutMs: 10_000 });

  it("putBundle streams the .tar.gz into bw-unpack on a v5 exec and closes stdin; the files are there; H1 refused", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const { b, id, proxyId, root } = await workPodIn(ns);
    const dir = `${root}/sandbox`;
    // Big enough to take many stdin frames, and not text.
    const blob = new Uint8Array(300 * 1024).map((_, i) => (i * 7919) % 251);
    const bundle = await tarGz([
      { header: { name: "task_impl.py", size: 14, type: "file" }, body: "print('hello')" },
      { header: { name: "data/", type: "directory", size: 0 } },
      { header: { name: "data/blob.bin", size: blob.length, type: "file" }, body: blob },
    ]);
    let mark = (await recorded(ns)).length;
    expect(await b.putBundle(id, streamOf(bundle), dir)).toEqual({
      ok: true,
      files: 3,
      bytes: 14 + blob.length,
    });
    const [unpack] = (await recorded(ns)).slice(mark);
    expect(line(unpack as RecordedRequest)).toBe(`GET ${api(ns, "pods", objectName(id))}/exec 101`);
    expect(unpack?.query).toMatchObject({
      command: ["/bw/tools/bin/bw-unpack", dir, "--max-bytes", "536870912", "--max-files", "20000"],
      container: ["work"],
      stdin: ["true"],
    });
    expect(unpack?.exec).toMatchObject({
      protocol: "v5.channel.k8s.io",
      stdinBytes: bundle.length,
      closedStdin: true,
      exitCode: 0,
    });
    expect((await sh(b, id, `cat ${dir}/task_impl.py`)).stdout).toBe("print('hello')");
    const sizes = await sh(b, id, `wc -c < ${dir}/data/blob.bin`);
    expect(sizes.stdout.trim()).toBe(String(blob.length));

    // case H1: a bundle that escapes its directory is refused with its code; nothing is written.
    mark = (await recorded(ns)).length;
    const bad = await tarGz([file("../escaped.txt", "x")]);
    expect(await b.putBundle(id, streamOf(bad), dir)).toMatchObject({
      ok: false,
      code: "bundle_path_traversal",
    });
    expect((await recorded(ns))[mark]?.exec?.exitCode).toBe(2);
    expect((await sh(b, id, `test -e ${root}/escaped.txt; echo $?`)).stdout).toBe("1\n");
    // Not a gzip at all: refused too, as bundle_invalid.
    const junk = new TextEncoder().encode("not a tar.gz");
    expect(await b.putBundle(id, streamOf(junk), dir)).toMatchObject({ ok: false, code: "bundle_invalid" });
    // A proxy sandbox has no stages; an unknown sandbox is not found.
    await expectBackendError(b.putBundle(proxyId, streamOf(bad), "/tmp"), "invalid_request");
    await expectBackendError(b.putBundle(randomId("sbx_"), streamOf(bad), "/tmp"), "not_found");
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("putBundle over v4 only is refused before a byte is sent (v4 cannot close stdin)", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const { b, id, proxyId, root } = await workPodIn(ns);
    await contractOptions({ namespace: ns, execProtocols: ["v4.channel.k8s.io"] });
    const mark = (await recorded(ns)).length;
    const bundle = await tarGz([file("a.txt", "a")]);
    const error = await expectBackendError(
      b.putBundle(id, streamOf(bundle), `${root}/sandbox`),
      "not_supported",
    );
    expect(error.message).toContain("v5.channel.k8s.io");
    const [attempt] = (await recorded(ns)).slice(mark);
    expect(attempt?.exec).toMatchObject({ protocol: "v4.channel.k8s.io", stdinBytes: 0, closedStdin: false });
    await contractOptions({ namespace: ns, execProtocols: ["v5.channel.k8s.io", "v4.channel.k8s.io"] });
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("collect returns bw-collect's archive from the exec's stdout: files/… then manifest.json; H4", {
    timeout: 60_000,
  }, async () => {
    // case H4
    const ns = newNs();
    const { b, id, proxyId, root } = await workPodIn(ns);
    const out = `${root}/out`;
    await sh(
      b,
      id,
      `mkdir -p ${out}/sub && printf 'result' > ${out}/result.txt && head -c 70000 /dev/urandom > ${out}/sub/r.bin && ln -s /etc/passwd ${out}/link`,
    );
    const bin = await sh(b, id, `od -An -tx1 -v ${out}/sub/r.bin | tr -d ' \n'`);
    const mark = (await recorded(ns)).length;
    const stream = await b.collect(id, { dir: out, maxBytes: 1024 * 1024, maxFiles: 100 });
    const [exec] = (await recorded(ns)).slice(mark);
    expect(exec?.query).toMatchObject({
      command: ["/bw/tools/bin/bw-collect", out, "--max-bytes", "1048576", "--max-files", "100"],
      container: ["work"],
    });
    expect(exec?.query.stdin).toBeUndefined();
    const names: string[] = [];
    const bodies: Record<string, Uint8Array> = {};
    for await (const { header, body } of tarGzEntries(stream, { maxTarBytes: 8 * 1024 * 1024 })) {
      names.push(header.name);
      bodies[header.name] = new Uint8Array(await new Response(body).arrayBuffer());
    }
    expect(names.slice(0, -1).sort()).toEqual(["files/result.txt", "files/sub/r.bin"]);
    expect(names.at(-1)).toBe("manifest.json");
    expect(new TextDecoder().decode(bodies["files/result.txt"])).toBe("result");
    const hex = [...(bodies["files/sub/r.bin"] as Uint8Array)]
      .map((x) => x.toString(16).padStart(2, "0"))
      .join("");
    expect(hex).toBe(bin.stdout);
    const manifest = CollectManifest.parse(JSON.parse(new TextDecoder().decode(bodies["manifest.json"])));
    expect(manifest.files.map((f) => f.path).sort()).toEqual(["result.txt", "sub/r.bin"]);
    expect(manifest.cut).toEqual([{ path: "link", reason: "symlink", size: null }]);
    expect(manifest.missing).toBe(false);

    // Nothing written: an archive that says so.
    const none = await b.collect(id, { dir: `${root}/nothing`, maxBytes: 1024, maxFiles: 10 });
    const entries: string[] = [];
    let last: Uint8Array | null = null;
    for await (const { header, body } of tarGzEntries(none, { maxTarBytes: 1024 * 1024 })) {
      entries.push(header.name);
      last = new Uint8Array(await new Response(body).arrayBuffer());
    }
    expect(entries).toEqual(["manifest.json"]);
    expect(CollectManifest.parse(JSON.parse(new TextDecoder().decode(last as Uint8Array))).missing).toBe(
      true,
    );
    await expectBackendError(
      b.collect(proxyId, { dir: "/tmp", maxBytes: 1, maxFiles: 1 }),
      "invalid_request",
    );
    await b.destroy(id);
    await b.destroy(proxyId);
  });
});
