import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { E2B_TEMPLATES, planTemplate } from "../../scripts/lib/e2b-templates";
import type {
  ContractLayerFiles,
  ContractTemplateBuild,
  E2bBuildFault,
  RecordedE2bRequest,
} from "../contract/e2b-contract";
import { startE2bServer } from "../contract/e2b-server";

// `npm run e2b:templates` (scripts/e2b-templates.ts), run as the operator runs it, with the real
// e2b SDK's Template API building both templates against the E2B CONTRACT SERVER's template build
// API (test/contract/e2b-builds.ts, loopback). What the server received is checked against the
// committed Dockerfiles, read here independently of the script's translation: the final stage's
// RUNs verbatim, its programs at their paths, the files uploaded with the hash the SDK computed.

const ROOT = resolve(import.meta.dirname, "../..");
const API_KEY = `e2b_${randomBytes(20).toString("hex")}`;
let server: Awaited<ReturnType<typeof startE2bServer>>;

beforeAll(async () => {
  server = await startE2bServer({
    apiKey: API_KEY,
    domain: "e2b.contract.test",
    templates: { proxy: "seeded-proxy", work: "seeded-work" },
  });
});
afterAll(() => server?.close());

interface Ran {
  code: number | null;
  output: string;
  stderr: string;
  requests: RecordedE2bRequest[];
}

/** The script as a process of its own, with only the environment an operator would give it. */
async function runScript(args: string[], env: Record<string, string>): Promise<Ran> {
  const since = (await requests()).at(-1)?.seq ?? 0;
  const child = spawn(process.execPath, ["--import", "tsx", "scripts/e2b-templates.ts", ...args], {
    cwd: ROOT,
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", HOME: process.env.HOME ?? "/tmp", ...env },
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
  const code = await new Promise<number | null>((r) => child.on("close", r));
  return { code, output: stdout + stderr, stderr, requests: await requests(since) };
}

async function requests(since = 0): Promise<RecordedE2bRequest[]> {
  const res = await fetch(`${server.info.url}/_contract/requests?since=${since}`);
  return (await res.json()) as RecordedE2bRequest[];
}

async function contractTemplates(): Promise<{
  builds: ContractTemplateBuild[];
  layers: ContractLayerFiles[];
}> {
  return (await (await fetch(`${server.info.url}/_contract/templates`)).json()) as never;
}

const connection = () => ({
  E2B_API_KEY: API_KEY,
  E2B_API_URL: server.info.url,
  E2B_DOMAIN: server.info.domain,
});
const sha256 = (data: string | Buffer) => createHash("sha256").update(data).digest("hex");

/** The final stage of a Dockerfile, read plainly: its FROM (ARG defaults put in) and its lines. */
function finalStage(file: string) {
  const text = readFileSync(join(ROOT, file), "utf8");
  const args = Object.fromEntries([...text.matchAll(/^ARG (\w+)=(\S+)$/gm)].map((m) => [m[1], m[2]]));
  const from = [...text.matchAll(/^FROM (\S+)/gm)].at(-1)?.[1] ?? "";
  const stage = text.slice(text.lastIndexOf("\nFROM "));
  return {
    fromImage: from.replace(/\$\{(\w+)\}/g, (_, a: string) => args[a] ?? ""),
    /** RUN instructions with their continuations joined as Docker joins them. */
    runs: [...stage.replace(/\\\n/g, "").matchAll(/^RUN (.*)$/gm)].map((m) => m[1] as string),
    /** The programs COPY --from=build puts in /opt/benchwright/. */
    bundles: [...stage.matchAll(/^COPY --from=build (.+) \/opt\/benchwright\/$/gm)].flatMap((m) =>
      (m[1] as string).split(" ").map((p) => p.replace(/^\/src\//, "")),
    ),
    heredocs: [...stage.matchAll(/^COPY --chmod=(\d+) <<'EOF' (\S+)\n([\s\S]*?)\nEOF$/gm)].map((m) => ({
      mode: m[1] as string,
      dest: m[2] as string,
      body: `${m[3]}\n`,
    })),
  };
}

type Step = NonNullable<ContractTemplateBuild["start"]>["steps"][number];

describe("npm run e2b:templates against the E2B contract server", { timeout: 120_000 }, () => {
  it("builds both templates: the final stages as E2B steps, the files as the SDK hashed them", async () => {
    const ran = await runScript([], connection());
    expect(ran.stderr).not.toMatch(/e2b:templates:/);
    expect(ran.code).toBe(0);
    expect(ran.output).not.toContain(API_KEY);

    const { builds, layers } = await contractTemplates();
    const allSteps: Step[] = [];
    for (const t of E2B_TEMPLATES) {
      const build = builds.filter((b) => b.name === t.name).at(-1) as ContractTemplateBuild;
      expect(build).toMatchObject({
        status: "ready",
        cpuCount: t.cpuCount,
        memoryMB: t.memoryMB,
        reason: null,
      });
      const stage = finalStage(t.dockerfile);
      const start = build.start as NonNullable<ContractTemplateBuild["start"]>;
      expect(start.fromImage).toBe(stage.fromImage);
      expect(start.fromTemplate).toBeUndefined();
      expect(start.startCmd).toBeUndefined(); // no start command: the broker starts everything
      const steps = start.steps;
      allSteps.push(...steps);
      // E2B's own order around the Dockerfile's: root and / first, `user` and its home last.
      expect(steps.slice(0, 2)).toMatchObject([
        { type: "USER", args: ["root"] },
        { type: "WORKDIR", args: ["/"] },
      ]);
      expect(steps.slice(-2)).toMatchObject([
        { type: "USER", args: ["user"] },
        { type: "WORKDIR", args: ["/home/user"] },
      ]);
      // Every RUN verbatim, in order: the apt-get line, the wrappers' `printf '#!/bin/sh\n…'`
      // with their backslashes (what E2B's own Dockerfile reader loses).
      const runs = steps.filter((s) => s.type === "RUN").map((s) => s.args?.[0]);
      expect(runs).toEqual(stage.runs);
      expect(runs[0]).toMatch(/^apt-get update && apt-get install -y --no-install-recommends/);
      expect(runs.join("\n")).toContain(
        String.raw`printf '#!/bin/sh\nexec node /opt/benchwright/exec-runner.cjs`,
      );
      const copies = steps.filter((s) => s.type === "COPY");
      expect(copies.map((s) => s.args)).toEqual([
        ...stage.bundles.map((src) => [src, "/opt/benchwright/", "root", ""]),
        ...stage.heredocs.map((h) => [
          `proxy-image/dist/e2b/${t.name}/${h.dest.split("/").at(-1)}`,
          h.dest,
          "root",
          `0${h.mode}`,
        ]),
      ]);
      expect(stage.bundles).toContain("proxy-image/dist/exec-runner.cjs");
      expect(stage.bundles).toContain("proxy-image/dist/e2b-bridge.cjs");
      // Each COPY's archive arrived, holds exactly that file with the host's bytes, and hashes to
      // the files hash the SDK sent (recomputed by the server).
      for (const copy of copies) {
        const [src, dest] = copy.args as [string, string];
        const layer = layers.find((l) => l.hash === copy.filesHash);
        expect(layer?.copy).toEqual({ src, dest, verified: true });
        const heredoc = stage.heredocs.find((h) => h.dest === dest);
        const bytes = heredoc ? heredoc.body : readFileSync(join(ROOT, src));
        expect(layer?.entries).toEqual([
          expect.objectContaining({
            path: src,
            type: "file",
            size: Buffer.byteLength(bytes),
            sha256: sha256(bytes),
          }),
        ]);
        if (heredoc) expect(layer?.entries[0]?.mode).toBe(Number.parseInt(heredoc.mode, 8));
      }
      // Progress printed: every phase E2B's builder logged, then ready.
      for (let i = 1; i <= steps.length; i++) expect(ran.output).toContain(`[builder ${i}/${steps.length}]`);
      expect(ran.output).toContain(`${t.name}: ready (template ${build.templateID}, build ${build.buildID})`);
    }

    // The files are E2B's cache: a COPY the work template shares with the proxy's (same file, same
    // place) is not uploaded twice. Uploads carry no API key (a pre-signed URL); the API all of it.
    const hashes = new Set(allSteps.filter((s) => s.type === "COPY").map((s) => s.filesHash));
    const uploads = ran.requests.filter((r) => r.api === "storage");
    expect(uploads.map((r) => r.path.split("/").at(-1)).sort()).toEqual([...hashes].sort());
    expect(hashes.size).toBeLessThan(allSteps.filter((s) => s.type === "COPY").length);
    expect(uploads.every((r) => r.method === "PUT" && r.apiKey === "absent" && r.status === 200)).toBe(true);
    const api = ran.requests.filter((r) => r.api === "platform");
    expect(api.length).toBeGreaterThan(0);
    expect(api.every((r) => r.apiKey === "ok")).toBe(true);
    expect(JSON.stringify(ran.requests)).not.toContain(API_KEY);

    // What was built is what sandboxes are made from: by name, answered with E2B's template id.
    const create = await fetch(`${server.info.url}/v2/sandboxes`, {
      method: "POST",
      headers: { "x-api-key": API_KEY, "content-type": "application/json" },
      body: JSON.stringify({ templateID: "benchwright-work" }),
    });
    const work = builds.filter((b) => b.name === "benchwright-work").at(-1);
    expect(create.status).toBe(201);
    const sandbox = (await create.json()) as { sandboxID: string; templateID: string; alias: string };
    expect(sandbox).toMatchObject({ templateID: work?.templateID, alias: "benchwright-work" });
    const kill = await fetch(`${server.info.url}/sandboxes/${sandbox.sandboxID}`, {
      method: "DELETE",
      headers: { "x-api-key": API_KEY },
    });
    expect(kill.status).toBe(204);
  });

  it("a build E2B fails: exit 1 with E2B's reason, under the name E2B_WORK_TEMPLATE gives", async () => {
    const fault: E2bBuildFault = {
      template: "bw-failing-work",
      runContaining: "apt-get install",
      exitCode: 100,
    };
    await fetch(`${server.info.url}/_contract/build-faults`, { method: "POST", body: JSON.stringify(fault) });
    const ran = await runScript(["work"], { ...connection(), E2B_WORK_TEMPLATE: "bw-failing-work" });
    expect(ran.code).toBe(1);
    const apt = finalStage("proxy-image/e2b-work.Dockerfile").runs[0];
    expect(ran.stderr).toContain(
      `e2b:templates: bw-failing-work: failed to run command '${apt}': exit status 100`,
    );
    expect(ran.output).not.toContain(API_KEY);
    const build = (await contractTemplates()).builds.filter((b) => b.name === "bw-failing-work").at(-1);
    const aptStep = (build?.start?.steps.findIndex((s) => s.args?.[0] === apt) ?? -2) + 1;
    expect(build).toMatchObject({ status: "error", reason: { step: String(aptStep) } });
    // Only the work template was asked for.
    const named = ran.requests
      .filter((r) => r.path === "/v3/templates")
      .map((r) => (r.body as { name: string }).name);
    expect(named).toEqual(["bw-failing-work"]);
  });

  it("a wrong API key: E2B's 401, exit 1, and neither key is printed", async () => {
    const wrong = `e2b_${randomBytes(20).toString("hex")}`;
    const ran = await runScript(["proxy"], { ...connection(), E2B_API_KEY: wrong });
    expect(ran.code).toBe(1);
    expect(ran.stderr).toMatch(/e2b:templates: benchwright-proxy: .*Unauthorized/);
    expect(ran.output).not.toContain(wrong);
    expect(ran.output).not.toContain(API_KEY);
    expect(ran.requests.map((r) => [r.path, r.apiKey, r.status])).toEqual([["/v3/templates", "wrong", 401]]);
  });

  it("no key in the environment, or an argument that is not a template: exit 2, nothing sent", async () => {
    const { E2B_API_KEY: _k, ...noKey } = connection();
    const missing = await runScript([], noKey);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("E2B_API_KEY must be set in the environment");
    // A key given as an argument is refused and not echoed.
    const argv = await runScript([API_KEY], connection());
    expect(argv.code).toBe(2);
    expect(argv.output).not.toContain(API_KEY);
    expect([...missing.requests, ...argv.requests]).toEqual([]);
  });
});

describe("the Dockerfile translation", () => {
  const work = readFileSync(join(ROOT, "proxy-image/e2b-work.Dockerfile"), "utf8");

  it(`takes the base image from an ARG default, as Docker does (ARG BASE_IMAGE, FROM \${BASE_IMAGE})`, () => {
    const withArg = `ARG BASE_IMAGE=node:24-bookworm-slim\n${work.replace(/^FROM \S+/gm, `FROM \${BASE_IMAGE}`)}`;
    const plain = planTemplate(work, "staging");
    const viaArg = planTemplate(withArg, "staging");
    expect(viaArg.fromImage).toBe("node:24-bookworm-slim");
    expect({ ...viaArg, fromImage: "" }).toEqual({ ...plain, fromImage: "" });
  });

  it("refuses what has no faithful E2B step, naming the line", () => {
    const final = work.lastIndexOf("\nFROM ");
    const line = work.slice(0, final).split("\n").length + 2;
    const insert = (ins: string) => `${work.slice(0, final)}\nFROM node:20-bookworm-slim\n${ins}\n`;
    expect(() => planTemplate(insert("ARG X=1"), "s")).toThrow(`line ${line}: ARG has no translation`);
    expect(() => planTemplate(insert('CMD ["bw-proxy"]'), "s")).toThrow(
      `line ${line}: CMD has no translation`,
    );
    expect(() => planTemplate(insert("COPY --link a /b"), "s")).toThrow(
      `line ${line}: COPY --link is not supported`,
    );
    expect(() => planTemplate(insert("COPY --from=nope /x /y"), "s")).toThrow(
      "--from=nope names no earlier stage",
    );
  });

  it("names the templates as the Worker's vars default them (wrangler.toml)", () => {
    const toml = readFileSync(join(ROOT, "wrangler.toml"), "utf8");
    for (const t of E2B_TEMPLATES) {
      expect(new RegExp(`^${t.env} = "([^"]+)"$`, "m").exec(toml)?.[1]).toBe(t.name);
    }
  });
});
