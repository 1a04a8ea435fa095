import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { type AddressInfo, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { ProxyView } from "@benchwright/shared/contract/proxy-view";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runProxy } from "../../proxy-image/src/proxy/run";
import { until } from "../until";
import { FakeControlPlane } from "./control-plane";
import { createTestCa, curl, startTlsUpstream, tlsArgs, type Upstream, vault } from "./harness";

// The proxy's view (view.ts, shared/contract/proxy-view.ts): the real proxy (run.ts) against the
// contract double of the control plane, real TLS upstreams on loopback, curl as the client; the
// view read over loopback and through `node proxy.cjs view` (bw-proxy-view).

const RUN = "run_view";
const CANARY = "sk-canary-view-5b0e91c4";
const PATH_MARKER = "path-marker-6f1d";
const HEADER_MARKER = "header-marker-a73c";
/** Built by the unit project's globalSetup. */
const PROXY_CJS = fileURLToPath(new URL("../../proxy-image/dist/proxy.cjs", import.meta.url));

/** `node proxy.cjs view` with only PATH and BW_VIEW_PORT in its environment. */
function viewProgram(port: number): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [PROXY_CJS, "view"],
      { env: { PATH: process.env.PATH ?? "", BW_VIEW_PORT: String(port) }, timeout: 20_000 },
      (err, stdout, stderr) =>
        resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
  });
}

describe("the proxy's view", () => {
  const cp = new FakeControlPlane(RUN, vault({}));
  let api: Upstream;
  let proxy: Awaited<ReturnType<typeof runProxy>>;
  let dir: string;
  let caFile: string;
  const stdout: string[] = [];
  const realWrite = process.stdout.write.bind(process.stdout);
  const viewUrl = () => `http://127.0.0.1:${proxy.view.port}/view`;
  const readView = async () => {
    const res = await fetch(viewUrl());
    return { status: res.status, text: await res.text() };
  };
  /** The view, parsed with the contract, once `ready` holds for it. */
  const viewWhen = (what: string, ready: (v: ProxyView) => boolean) =>
    until(what, async () => {
      const view = ProxyView.parse(JSON.parse((await readView()).text));
      return ready(view) ? view : null;
    });

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "bw-view-test-"));
    const testCa = await createTestCa();
    writeFileSync(join(dir, "upstream-ca.pem"), testCa.certPem);
    api = await startTlsUpstream({ ca: testCa, hosts: ["api.test", "free.test"] });
    // Catch-all (the wildcard block), so that the run CA vouches for free.test too: under default
    // routing it is constrained to the hosts file's names (case N5).
    cp.vault = vault({
      version: 7,
      hosts: [
        { pattern: "evil.test", action: "block" },
        { pattern: "*.evil.test", action: "block" },
      ],
      rules: [{ host: "api.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } }],
    });
    cp.secrets = { API_KEY: CANARY };
    await cp.start();
    process.stdout.write = ((chunk: string | Uint8Array, ...rest: unknown[]) => {
      stdout.push(String(chunk));
      return (realWrite as (c: string | Uint8Array, ...r: unknown[]) => boolean)(chunk, ...rest);
    }) as typeof process.stdout.write;
    proxy = await runProxy(
      {
        ...cp.proxyEnv(join(dir, "spool")),
        BW_VIEW_PORT: "0",
        // free.test is terminated, not spliced: the client trusts the run CA, not the upstream's.
        BW_SPLICE: "off",
        BW_TEST_EXTRA_CA_FILE: join(dir, "upstream-ca.pem"),
        BW_TEST_ROUTES: `api.test=${api.address}:${api.port},free.test=${api.address}:${api.port}`,
        BW_TEST_ALLOW_CIDRS: "127.0.0.2/32",
      },
      [],
    );
    caFile = join(dir, "run-ca.pem");
    writeFileSync(caFile, proxy.ca.certPem);

    const via = (host: string, path = "/") => [
      ...tlsArgs({ caFile, tlsPort: proxy.listeners.tls }, host),
      "-H",
      `x-note: ${HEADER_MARKER}`,
      `https://${host}${path}`,
    ];
    // One of each: allowed with the vault credential, allowed without one, blocked by the
    // policy, refused by the proxy itself (CONNECT to a port other than 443).
    expect((await curl(via("api.test", `/v1/${PATH_MARKER}?q=${PATH_MARKER}`))).status).toBe(200);
    expect(api.seen.at(-1)?.headers.authorization).toBe(`Bearer ${CANARY}`);
    expect((await curl(via("free.test", `/${PATH_MARKER}`))).status).toBe(200);
    expect((await curl(via("evil.test", `/${PATH_MARKER}`))).status).toBe(403);
    const connect = await curl([
      "-p",
      "-x",
      `http://127.0.0.1:${proxy.listeners.explicit}`,
      "http://h.test:22/",
    ]);
    expect(connect.stderr).toContain("403");
  });

  afterAll(async () => {
    process.stdout.write = realWrite;
    await proxy?.shutdown();
    await api?.close();
    await cp.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it("counts every decision and keeps each one's host, port, method, outcome and rule", async () => {
    const view = await viewWhen("four decisions", (v) => v.counts.requests === 4);
    expect(view).toMatchObject({
      runId: RUN,
      policyVersion: 7,
      policyState: "ready",
      counts: { requests: 4, allow: 2, block: 1, refuse: 1, error: 0, injected: 1 },
    });
    const row = { policyVersion: 7 };
    expect(view.recent).toHaveLength(4);
    expect(view.recent).toMatchObject([
      {
        ...row,
        listener: "tls",
        host: "api.test",
        port: 443,
        method: "GET",
        decision: "allow",
        reason: "allowed, credential injected",
        status: 200,
        rule: 0,
      },
      { ...row, listener: "tls", host: "free.test", port: 443, decision: "allow", status: 200, rule: null },
      {
        ...row,
        listener: "tls",
        host: "evil.test",
        decision: "block",
        reason: "host blocked by policy",
        status: 403,
        rule: null,
      },
      {
        ...row,
        listener: "explicit",
        host: "h.test",
        port: 22,
        method: "CONNECT",
        decision: "refuse",
        status: 403,
        rule: null,
      },
    ]);
    const times = [view.startedAt, ...view.recent.map((r) => r.at), view.generatedAt].map(Date.parse);
    expect([...times].sort((a, b) => a - b)).toEqual(times);
    // Stdout keeps its one line per decision (written in batches: a chunk may hold several).
    const lines = stdout.join("").split("\n");
    expect(lines.filter((l) => l.includes('"event":"decision"'))).toHaveLength(4);
  });

  it("reports the audit reporter's counts as they change", async () => {
    // api.test and free.test: a direct route each; evil.test: a blocked row and a refused route.
    const view = await viewWhen("the audit rows to be delivered", (v) => v.audit.rowsSent === 4);
    expect(view.audit).toMatchObject({
      rowsRecorded: 4,
      rowsSent: 4,
      rowsRejected: 0,
      rowsRefused: 0,
      batchesRejected: 0,
      pendingBatches: 0,
      accepting: true,
    });
    expect(cp.auditRows).toBe(4);
  });

  it("never shows a secret, a path or a header value", async () => {
    const { status, text } = await readView();
    expect(status).toBe(200);
    expect(text).toContain("api.test"); // the check can see what is there
    for (const needle of [CANARY, PATH_MARKER, HEADER_MARKER, cp.token, cp.auditKey])
      expect(text).not.toContain(needle);
  });

  it("listens on 127.0.0.1 only, and answers nothing but GET /view", async () => {
    expect(proxy.view.address).toBe("127.0.0.1");
    const other = await fetch(`http://127.0.0.2:${proxy.view.port}/view`).then(
      () => "answered",
      (e: Error & { cause?: { code?: string } }) => e.cause?.code,
    );
    expect(other).toBe("ECONNREFUSED");
    for (const [method, path] of [
      ["GET", "/"],
      ["GET", "/view/x"],
      ["POST", "/view"],
      ["DELETE", "/view"],
    ] as const) {
      const res = await fetch(`http://127.0.0.1:${proxy.view.port}${path}`, { method });
      expect(res.status, `${method} ${path}`).toBe(404);
    }
  });

  it("prints the same view as one line through `proxy.cjs view` (bw-proxy-view)", async () => {
    const printed = await viewProgram(proxy.view.port);
    expect(printed).toMatchObject({ code: 0, stderr: "" });
    expect(printed.stdout.endsWith("\n")).toBe(true);
    expect(printed.stdout.trimEnd().split("\n")).toHaveLength(1);
    const { generatedAt: _a, ...fromProgram } = ProxyView.parse(JSON.parse(printed.stdout));
    const { generatedAt: _b, ...direct } = ProxyView.parse(JSON.parse((await readView()).text));
    expect(fromProgram).toEqual(direct);
    expect(printed.stdout).not.toContain(CANARY);
  });

  it("`proxy.cjs view` exits 1 with a one-line reason when no view answers", async () => {
    const closed = createServer();
    await new Promise<void>((r) => closed.listen(0, "127.0.0.1", r));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((r) => closed.close(r));
    const printed = await viewProgram(port);
    expect(printed.code).toBe(1);
    expect(printed.stdout).toBe("");
    expect(printed.stderr).toBe(
      `bw-proxy-view: cannot read the proxy's view at http://127.0.0.1:${port}/view: ECONNREFUSED\n`,
    );
  });
});
