import { createExecutionContext, runInDurableObject, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { brokerStub, SandboxBroker } from "../../src/broker/sandbox-broker";
import { brokerValue } from "../../src/coordinator/ports";
import { randomId } from "../../src/crypto/api-keys";
import { runArtifacts, sandboxes } from "../../src/db/schema";
import worker from "../../src/index";
import { type ArtifactArchiveError, downloadName, storeArtifacts } from "../../src/runs/artifacts";
import { collectArchive, file, gzip, sha256Hex, streamOf, tarGz } from "./archives";
import { loggedIn } from "./browser";
import { BASE, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { newRun, type TestRun } from "./run-fixtures";

// Results out: bw-collect's archive (built here as bw-collect writes it) stored through
// storeArtifacts into the test plugin's real local R2 and the real Postgres, then listed and
// downloaded through the API and the run page; what was cut is listed (case H4); a lying archive
// stores nothing.

const sandbox = () => randomId("sbx_");

async function store(
  run: TestRun,
  sandboxId: string,
  sandboxName: string,
  archive: Uint8Array,
  limits?: object,
) {
  return withDb((db) =>
    storeArtifacts(env, db, {
      runId: run.id,
      environmentId: run.tenant.environmentId,
      sandboxId,
      sandboxName,
      archive: streamOf(archive),
      ...(limits ? { limits: limits as { maxBytes: number; maxFiles: number } } : {}),
    }),
  );
}

/** The R2 keys under the run's artifacts/. */
async function objects(runId: string): Promise<string[]> {
  return (await env.FILES.list({ prefix: `artifacts/${runId}/` })).objects.map((o) => o.key).sort();
}

const rows = (runId: string) =>
  withDb((db) => db.select().from(runArtifacts).where(eq(runArtifacts.runId, runId)));

async function refusal(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (e) {
    return (e as ArtifactArchiveError).code;
  }
  return "stored";
}

describe("artifacts: stored, listed, downloaded", () => {
  it("stores each sandbox's files in R2 and Postgres; the API lists them and serves their bytes", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    const [work, task] = [sandbox(), sandbox()];
    const binary = new Uint8Array(70_000).map((_, i) => i % 251);
    const summary = await store(
      run,
      work,
      "work",
      await collectArchive([
        { path: "results.json", body: '{"score":0.93}\n' },
        { path: "logs/run.log", body: "started\nfinished\n" },
        { path: "empty.txt", body: "" },
      ]),
    );
    expect(summary).toEqual({ files: 3, bytes: 15 + 17, cut: 0, incomplete: false });
    await store(run, task, "t1", await collectArchive([{ path: "out.bin", body: binary }]));

    const listed = await t.api("GET", `/v1/runs/${run.id}/artifacts`);
    expect(listed.status, listed.text).toBe(200);
    expect(listed.json.cut).toEqual([]);
    const artifacts = listed.json.artifacts as Array<Record<string, string | number>>;
    expect(artifacts.map((a) => [a.sandboxName, a.path, a.size])).toEqual([
      ["t1", "out.bin", 70_000],
      ["work", "empty.txt", 0],
      ["work", "logs/run.log", 17],
      ["work", "results.json", 15],
    ]);
    expect(artifacts[0]).toMatchObject({ sandboxId: task, sha256: await sha256Hex(binary) });
    expect(await objects(run.id)).toEqual(artifacts.map((a) => `artifacts/${run.id}/${a.id}`).sort());

    for (const a of artifacts) {
      const res = await fetchBytes(t, `/v1/runs/${run.id}/artifacts/${a.id}`);
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toBe("application/octet-stream");
      expect(res.headers.get("x-content-type-options")).toBe("nosniff");
      expect(res.headers.get("content-disposition")).toBe(
        `attachment; filename="${String(a.path).split("/").at(-1)}"`,
      );
      expect(await sha256Hex(res.bytes)).toBe(a.sha256);
      expect(res.bytes.length).toBe(a.size);
    }
    expectProblem(await t.api("GET", `/v1/runs/${run.id}/artifacts/art_nope`), 404, "not_found");
  });

  it("storing a sandbox's archive again changes nothing (a retried collect)", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    const work = sandbox();
    const archive = await collectArchive([{ path: "a.txt", body: "a" }], {
      cut: [{ path: "big.bin", reason: "too_large", size: 99 }],
    });
    const first = await store(run, work, "work", archive);
    const before = await rows(run.id);
    const keys = await objects(run.id);
    // Even a different archive: the sandbox's artifacts are stored already.
    const again = await store(run, work, "work", await collectArchive([{ path: "b.txt", body: "b" }]));
    expect(again).toEqual({ ...first, incomplete: false });
    expect(await rows(run.id)).toEqual(before);
    expect(await objects(run.id)).toEqual(keys);
  });

  // case H4
  it("case H4: what bw-collect cut is listed with its reason (bounds, symlinks, special files); nothing of it is stored", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    const work = sandbox();
    const cut = [
      { path: "huge.bin", reason: "too_large", size: 70_000_000 },
      { path: "many/f1001", reason: "too_many", size: 3 },
      { path: "secrets", reason: "symlink", size: null },
      { path: "proc-environ", reason: "symlink", size: null },
      { path: "pipe", reason: "special", size: null },
      { path: "locked.txt", reason: "unreadable", size: 12 },
    ];
    const summary = await store(
      run,
      work,
      "work",
      await collectArchive([{ path: "kept.txt", body: "kept" }], { cut, manifest: { incomplete: true } }),
    );
    expect(summary).toEqual({ files: 1, bytes: 4, cut: 6, incomplete: true });
    const listed = await t.api("GET", `/v1/runs/${run.id}/artifacts`);
    expect(listed.json.artifacts.map((a: { path: string }) => a.path)).toEqual(["kept.txt"]);
    expect(listed.json.cut).toEqual(
      [...cut]
        .sort((x, y) => (x.path < y.path ? -1 : 1))
        .map((c) => ({ sandboxId: work, sandboxName: "work", ...c })),
    );
    // Only the kept file has bytes in R2.
    expect(await objects(run.id)).toHaveLength(1);
    // A cut entry is not downloadable.
    const [cutRow] = (await rows(run.id)).filter((r) => r.path === "huge.bin");
    expectProblem(await t.api("GET", `/v1/runs/${run.id}/artifacts/${cutRow?.id}`), 404, "not_found");
  });

  it("a file the manifest does not list (cut after it was copied) is no artifact; its bytes are removed", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    const archive = await collectArchive([{ path: "listed.txt", body: "ok" }], {
      extra: [file("files/changed.txt", "half-written")],
      cut: [{ path: "changed.txt", reason: "unreadable", size: 12 }],
    });
    expect(await store(run, sandbox(), "work", archive)).toMatchObject({ files: 1, cut: 1 });
    expect(await objects(run.id)).toHaveLength(1);
    const listed = await t.api("GET", `/v1/runs/${run.id}/artifacts`);
    expect(listed.json.artifacts.map((a: { path: string }) => a.path)).toEqual(["listed.txt"]);
  });

  it("an archive that lies (bytes, bounds, paths, order) stores nothing at all", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    const limits = { maxBytes: 1000, maxFiles: 3 };
    const lies: Array<[string, Uint8Array, string]> = [
      [
        "a file whose bytes are not its listed sha256",
        await collectArchive([{ path: "a.txt", body: "a" }], {
          manifest: { files: [{ path: "a.txt", size: 1, sha256: "0".repeat(64) }] },
        }),
        "archive_inconsistent",
      ],
      [
        "a listed file the archive lacks",
        await collectArchive([], {
          manifest: { files: [{ path: "ghost", size: 1, sha256: "0".repeat(64) }] },
        }),
        "archive_inconsistent",
      ],
      [
        "more bytes than the broker asked for",
        await collectArchive([
          { path: "a.bin", body: new Uint8Array(600) },
          { path: "b.bin", body: new Uint8Array(600) },
        ]),
        "archive_too_large",
      ],
      [
        "more files than the broker asked for",
        await collectArchive(["1", "2", "3", "4"].map((n) => ({ path: n, body: n }))),
        "archive_too_large",
      ],
      [
        "a path out of $BW_OUT",
        await tarGz([file("files/../../etc/passwd", "x"), file("manifest.json", "{}")]),
        "archive_inconsistent",
      ],
      [
        "an entry outside files/",
        await collectArchive([], { extra: [file("other.txt", "x")] }),
        "archive_inconsistent",
      ],
      [
        "a symlink entry",
        await collectArchive([], {
          extra: [
            { header: { name: "files/link", type: "symlink", size: 0, linkname: "/proc/self/environ" } },
          ],
        }),
        "archive_inconsistent",
      ],
      [
        "an entry after the manifest",
        await collectArchive([], { after: [file("files/late", "x")] }),
        "archive_inconsistent",
      ],
      ["no manifest", await tarGz([file("files/a.txt", "a")]), "archive_inconsistent"],
      [
        "a manifest that is not one",
        await tarGz([file("manifest.json", '{"files":"all"}')]),
        "archive_invalid",
      ],
      ["not gzip", new TextEncoder().encode("plain text"), "archive_invalid"],
      ["gzip but no tar", await gzip(new TextEncoder().encode("z".repeat(1500))), "archive_invalid"],
    ];
    const got: string[] = [];
    for (const [, archive] of lies) got.push(await refusal(store(run, sandbox(), "work", archive, limits)));
    expect(got).toEqual(lies.map(([, , code]) => code));
    expect(await rows(run.id)).toEqual([]);
    expect(await objects(run.id)).toEqual([]);
  });

  it("the download name is the last path segment in safe characters", () => {
    expect(downloadName("results/score.json")).toBe("score.json");
    expect(downloadName('out/evil"; filename=x.html\r\n')).toBe("evil___filename_x.html__");
    expect(downloadName(".bashrc")).toBe("bashrc");
    expect(downloadName("résumé.pdf")).toBe("r_sum_.pdf");
    expect(downloadName("...")).toBe("artifact");
  });
});

describe("artifacts: isolation and the run page", () => {
  it("another environment's run and artifacts are 404 (list and download)", async () => {
    const [a, b] = [await newTenant(), await newTenant()];
    const run = await newRun(a, { status: "running" });
    await store(run, sandbox(), "work", await collectArchive([{ path: "mine.txt", body: "A's result" }]));
    const [row] = await rows(run.id);
    expectProblem(await b.api("GET", `/v1/runs/${run.id}/artifacts`), 404, "not_found");
    expectProblem(await b.api("GET", `/v1/runs/${run.id}/artifacts/${row?.id}`), 404, "not_found");
    // B's own run with A's artifact id: not B's either.
    const theirs = await newRun(b, { status: "running" });
    expectProblem(await b.api("GET", `/v1/runs/${theirs.id}/artifacts/${row?.id}`), 404, "not_found");
    expect((await b.api("GET", `/v1/runs/${theirs.id}/artifacts`)).json).toEqual({ artifacts: [], cut: [] });
    expect((await fetchBytes(a, `/v1/runs/${run.id}/artifacts/${row?.id}`)).status).toBe(200);
  });

  it("the run page lists the artifacts and what was cut, with download links that work", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "finished" });
    const task = sandbox();
    await store(
      run,
      task,
      "t1",
      await collectArchive([{ path: "answer.txt", body: "42\n" }], {
        cut: [{ path: "link", reason: "symlink", size: null }],
      }),
    );
    const [artifact] = (await rows(run.id)).filter((r) => r.cutReason === null);
    const browser = await loggedIn(t, `/runs/${run.id}`);
    const page = await browser.get(`/runs/${run.id}`);
    expect(page.status).toBe(200);
    expect(page.html).toContain(`href="/runs/${run.id}/artifacts/${artifact?.id}"`);
    expect(page.html).toContain("answer.txt");
    expect(page.html).toMatch(/<td>link<\/td>|>link<\/td>/);
    expect(page.html).toContain("symlink");
    const download = await browser.get(`/runs/${run.id}/artifacts/${artifact?.id}`);
    expect(download.status).toBe(200);
    expect(download.html).toBe("42\n");
    expect(download.headers.get("content-disposition")).toBe('attachment; filename="answer.txt"');
    // Another tenant's browser: no such run.
    const other = await loggedIn(await newTenant(), "/runs");
    expect((await other.get(`/runs/${run.id}/artifacts/${artifact?.id}`)).status).toBe(404);
  });
});

describe("broker: collect", () => {
  it("stores the archive the backend packs for a work sandbox of the run; refuses its proxy sandbox", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    const [work, proxy] = [sandbox(), sandbox()];
    await withDb((db) =>
      db.insert(sandboxes).values([
        { id: work, runId: run.id, kind: "work", backend: "local", status: "ready" },
        { id: proxy, runId: run.id, kind: "proxy", backend: "local", status: "ready" },
      ]),
    );
    const archive = await collectArchive([{ path: "r.json", body: "{}" }], {
      cut: [{ path: "x", reason: "too_many", size: 1 }],
    });
    const asked: unknown[] = [];
    const backend = {
      collect: async (sandboxId: string, options: unknown) => {
        asked.push([sandboxId, options]);
        return streamOf(archive);
      },
    };
    const options = {
      environmentId: t.environmentId,
      sandboxName: "work",
      dir: "/home/sandbox/out",
      maxBytes: 1000,
      maxFiles: 10,
    };
    const result = await runInDurableObject(brokerStub(env, run.id), async (_i, state) => {
      const broker = new SandboxBroker(state, env);
      Object.defineProperty(broker, "backendOf", { value: () => backend });
      const summary = brokerValue(await broker.collect(run.id, work, options));
      let refused = "";
      const fromProxy = await broker.collect(run.id, proxy, options);
      if (!fromProxy.ok) refused = fromProxy.code;
      // A run of another environment cannot collect into this one.
      const elsewhere = await broker.collect(run.id, work, { ...options, environmentId: "env_other" });
      if (!elsewhere.ok) refused += `,${elsewhere.code}`;
      return { summary, refused };
    });
    expect(result).toEqual({
      summary: { files: 1, bytes: 2, cut: 1, incomplete: false },
      refused: "not_found,not_found",
    });
    expect(asked).toEqual([[work, { dir: "/home/sandbox/out", maxBytes: 1000, maxFiles: 10 }]]);
    expect((await rows(run.id)).map((r) => r.path).sort()).toEqual(["r.json", "x"]);
  });
});

/** A GET whose body is bytes (an artifact download), read as bytes. */
async function fetchBytes(t: Tenant, path: string) {
  const ctx = createExecutionContext();
  const res = await worker.fetch(
    new Request(`${BASE}${path}`, { headers: { authorization: `Bearer ${t.key}` } }),
    env,
    ctx,
  );
  const bytes = new Uint8Array(await res.arrayBuffer());
  await waitOnExecutionContext(ctx);
  return { status: res.status, headers: res.headers, bytes };
}
