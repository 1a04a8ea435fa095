import { execFile, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildahMissing } from "../../local-agent/buildah";
import { type RealRegistry, registryMissing, startRealRegistry } from "../setup/registry";

// `npm run images -- --push <registry>` as an operator runs it (the script, a process of its
// own), against the REAL registry: Debian's docker-registry (distribution 2.8) on loopback with
// token auth (test/setup/registry.ts). buildah gets its credentials from the auth file named by
// REGISTRY_AUTH_FILE, as `buildah login` would leave them; what it pushed is read back with skopeo
// by the digest the script printed, as a node pulling the pinned image would.
//
// Needs root, buildah, docker-registry and skopeo (.ci/run installs them); skipped with a message
// elsewhere, but not under CI.

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const SKIP_REASON = process.env.CI
  ? null
  : (buildahMissing() ?? registryMissing(["docker-registry", "skopeo"]));
if (SKIP_REASON) console.warn(`image push tests skipped: ${SKIP_REASON}`);

interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** The script with `args`; asynchronous, since the registry's realm answers in this process. */
function images(args: string[], env: Record<string, string> = {}): Promise<Ran> {
  const child = spawn(process.execPath, ["--import", "tsx", "scripts/images.ts", ...args], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d: Buffer) => {
    stdout += d;
  });
  child.stderr.on("data", (d: Buffer) => {
    stderr += d;
  });
  return new Promise((resolve) => child.on("close", (code) => resolve({ code, stdout, stderr })));
}

describe("npm run images -- --push: arguments", () => {
  it("refuses a destination that is not a registry, before building anything", async () => {
    const bad = await images(["--push", "Registry.Example.com/x y", "proxy"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('not a registry: "Registry.Example.com/x y"');
    expect(bad.stdout).toBe("");
    const none = await images(["proxy", "--push"]);
    expect(none.code).toBe(2);
    expect(none.stderr).toContain("usage: npm run images");
  });
});

describe.skipIf(SKIP_REASON !== null)("npm run images -- --push, on the real registry", () => {
  let registry: RealRegistry;
  let work: string;

  beforeAll(async () => {
    registry = await startRealRegistry();
    work = mkdtempSync(join(tmpdir(), "bw-images-push-"));
  });
  afterAll(async () => {
    await registry?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  const skopeo = (args: string[]) =>
    new Promise<string>((resolve, reject) =>
      execFile(
        "skopeo",
        [args[0] as string, "--tls-verify=false", "--authfile", registry.authFile(work), ...args.slice(1)],
        { encoding: "utf8", env: { PATH: process.env.PATH } },
        (error, stdout, stderr) =>
          error ? reject(new Error(`skopeo ${args[0]}: ${stderr || error.message}`)) : resolve(stdout),
      ),
    );

  /** The script's lines for one pushed image: its size, its tag and its reference by digest. */
  function pushedOf(stdout: string, repository: string) {
    const size = /^image localhost\/benchwright-proxy: built in [\d.]+ s, ([\d.]+) MB$/m.exec(stdout);
    const esc = repository.replace(/[.]/g, "\\.");
    const pushed = new RegExp(
      `^pushed localhost/benchwright-proxy as (${esc}:(sha256-[0-9a-f]{64}))\\n  (${esc}@(sha256:[0-9a-f]{64}))$`,
      "m",
    ).exec(stdout);
    if (!size || !pushed) throw new Error(`the script printed no size or push for the proxy:\n${stdout}`);
    const [, megabytes = ""] = size;
    const [, tagged = "", tag = "", reference = "", digest = ""] = pushed;
    return { megabytes: Number(megabytes), tagged, tag, reference, digest };
  }

  it("pushes the proxy image tagged by its content; the registry serves it by the printed digest", async () => {
    const auth = registry.authFile(work);
    const destination = `${registry.info.host}/bw-images`;
    const repository = `${destination}/benchwright-proxy`;
    const ran = await images(["--push", destination, "proxy"], { REGISTRY_AUTH_FILE: auth });
    expect(ran.code, ran.stderr).toBe(0);
    const pushed = pushedOf(ran.stdout, repository);
    expect(pushed.megabytes).toBeLessThan(150);

    // The manifest the registry holds under that digest is the one pushed, and the tag names it.
    const raw = await skopeo(["inspect", "--raw", `docker://${pushed.reference}`]);
    expect(`sha256:${createHash("sha256").update(raw).digest("hex")}`).toBe(pushed.digest);
    const byTag = JSON.parse(await skopeo(["inspect", `docker://${pushed.tagged}`])) as { Digest: string };
    expect(byTag.Digest).toBe(pushed.digest);
    // The tag is the image's config digest: what the image is, whatever the compression.
    const manifest = JSON.parse(raw) as { config: { digest: string }; layers: unknown[] };
    expect(pushed.tag).toBe(manifest.config.digest.replace(":", "-"));
    expect(manifest.layers).toHaveLength(1);
    const config = JSON.parse(await skopeo(["inspect", "--config", `docker://${pushed.reference}`])) as {
      config: { User: string; Entrypoint: string[] };
    };
    expect(config.config).toMatchObject({
      User: "10001:10001",
      Entrypoint: ["node", "/opt/benchwright/proxy.cjs"],
    });

    // The same build pushed again: the same tag and the same digest.
    const again = await images(["--push", destination, "proxy"], { REGISTRY_AUTH_FILE: auth });
    expect(again.code, again.stderr).toBe(0);
    expect(pushedOf(again.stdout, repository)).toMatchObject({ tag: pushed.tag, digest: pushed.digest });
  }, 600_000); // two runs of the script, each a cached build and a push of the image's 130 MB

  it("without credentials pushes nothing, names the image and exits 1", async () => {
    const empty = join(work, "empty-auth.json");
    writeFileSync(empty, JSON.stringify({ auths: {} }), { mode: 0o600 });
    const destination = `${registry.info.host}/bw-denied`;
    const ran = await images(["--push", destination, "proxy"], { REGISTRY_AUTH_FILE: empty });
    expect(ran.code).toBe(1);
    expect(ran.stderr).toContain(
      `the proxy image (localhost/benchwright-proxy) was not pushed to ${destination}`,
    );
    expect(ran.stdout).not.toContain("pushed localhost/benchwright-proxy");
    await expect(skopeo(["list-tags", `docker://${destination}/benchwright-proxy`])).rejects.toThrow();
  }, 300_000);
});
