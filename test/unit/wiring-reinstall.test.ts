import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { PLATFORM_HOSTS } from "@benchwright/shared/contract/proxy-wire";
import { ReinstallResult, type WiringReinstall } from "@benchwright/shared/contract/wiring";
import { filesFirst } from "@benchwright/shared/policy/hosts-file";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRunCa } from "../../proxy-image/src/proxy/ca";

// `bw-wiring reinstall` (proxy-image/dist/wiring.cjs), run as a process on temporary files laid
// out as a sandbox's: what the e2b backend's seal and setHosts write from the control plane's
// copy after a root setup stage may have changed them (case G2).

const WIRING = resolve(import.meta.dirname, "../../proxy-image/dist/wiring.cjs");
let dir: string;
let caPem: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "bw-reinstall-"));
  caPem = (await createRunCa({ runId: "run_reinstall" })).certPem;
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function reinstall(input: WiringReinstall): {
  code: number | null;
  result: ReinstallResult | null;
  stderr: string;
} {
  const res = spawnSync(process.execPath, [WIRING, "reinstall"], {
    input: JSON.stringify(input),
    encoding: "utf8",
    timeout: 20_000,
  });
  const line = res.stdout.trim();
  return {
    code: res.status,
    result: line ? ReinstallResult.parse(JSON.parse(line)) : null,
    stderr: res.stderr,
  };
}

describe("bw-wiring reinstall", () => {
  it("rewrites what a root setup changed: hosts lines, the block, the resolver order, the CA; G2", () => {
    // case G2
    const paths = {
      hostsPath: join(dir, "hosts"),
      nsswitchPath: join(dir, "nsswitch.conf"),
      caDir: join(dir, "ca"),
      caBundlePath: join(dir, "bundle.crt"),
    };
    // What setup left: the named host sent elsewhere before the block, the block emptied, the
    // resolver asked before the hosts file, a bundle without the run CA.
    writeFileSync(
      paths.hostsPath,
      [
        "127.0.0.1 localhost",
        "203.0.113.9 api.openai.com evil.example",
        "# BEGIN benchwright wiring (rewritten by each wiring run; do not edit)",
        "# END benchwright wiring",
        "",
      ].join("\n"),
      { mode: 0o666 },
    );
    writeFileSync(paths.nsswitchPath, "passwd: files\nhosts: dns files\n");
    writeFileSync(paths.caBundlePath, "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
    const r = reinstall({
      mode: "default",
      proxyAddress: "127.0.0.1",
      hostsFile: ["api.openai.com"],
      caCertPem: caPem,
      ...paths,
    });
    expect(r).toMatchObject({ code: 0, stderr: "" });
    expect(r.result).toEqual({
      ok: true,
      hostsEntries: [...new Set(["api.openai.com", ...PLATFORM_HOSTS])].map((h) => `127.0.0.1 ${h}`),
    });
    const hosts = readFileSync(paths.hostsPath, "utf8");
    expect(hosts).toContain("203.0.113.9\tevil.example\n");
    expect(hosts).not.toMatch(/203\.0\.113\.9.*api\.openai\.com/);
    expect(hosts).toContain("127.0.0.1 api.openai.com\n");
    expect(statSync(paths.hostsPath).mode & 0o777).toBe(0o644);
    expect(readFileSync(paths.nsswitchPath, "utf8")).toBe("passwd: files\nhosts:          files dns\n");
    expect(readFileSync(join(paths.caDir, "run-ca.pem"), "utf8")).toBe(
      caPem.endsWith("\n") ? caPem : `${caPem}\n`,
    );
    expect(readFileSync(paths.caBundlePath, "utf8")).toContain(caPem.trim());
    // Twice is the same.
    const again = readFileSync(paths.hostsPath, "utf8");
    expect(
      reinstall({
        mode: "default",
        proxyAddress: "127.0.0.1",
        hostsFile: ["api.openai.com"],
        caCertPem: caPem,
        ...paths,
      }).code,
    ).toBe(0);
    expect(readFileSync(paths.hostsPath, "utf8")).toBe(again);
    expect(readFileSync(paths.caBundlePath, "utf8").split("BEGIN CERTIFICATE").length).toBe(3);
  });

  it("a vault edit: only the hosts block changes (caCertPem null leaves the CA files alone)", () => {
    const paths = {
      hostsPath: join(dir, "hosts2"),
      nsswitchPath: join(dir, "nss2"),
      caDir: join(dir, "ca2"),
      caBundlePath: join(dir, "b2"),
    };
    writeFileSync(paths.hostsPath, "127.0.0.1 localhost\n");
    const r = reinstall({
      mode: "default",
      proxyAddress: "127.0.0.1",
      hostsFile: ["a.example", "b.example"],
      caCertPem: null,
      ...paths,
    });
    expect(r.code).toBe(0);
    const hosts = readFileSync(paths.hostsPath, "utf8");
    expect(hosts).toContain("127.0.0.1 a.example\n127.0.0.1 b.example\n");
    expect(() => statSync(paths.caDir)).toThrow();
    expect(() => statSync(paths.caBundlePath)).toThrow();
    // sandbox0's sealer: the resolver order is not its to restore; nothing is written there.
    writeFileSync(paths.nsswitchPath, "hosts: dns\n");
    const sealer = reinstall({
      mode: "default",
      proxyAddress: "127.0.0.1",
      hostsFile: ["c.example"],
      caCertPem: null,
      ...paths,
      nsswitchPath: null,
    });
    expect(sealer.code).toBe(0);
    expect(readFileSync(paths.hostsPath, "utf8")).toContain("127.0.0.1 c.example\n");
    expect(readFileSync(paths.nsswitchPath, "utf8")).toBe("hosts: dns\n");
  });

  it("refuses bad input (exit 2) and says which file it could not write (exit 1)", () => {
    const bad = reinstall({
      mode: "catch-all",
      proxyAddress: "127.0.0.1",
      hostsFile: ["a.example"],
      caCertPem: null,
    });
    expect(bad).toMatchObject({ code: 2, result: null });
    expect(bad.stderr).toContain("hostsFile: must be empty under catch-all routing");
    const blocked = reinstall({
      mode: "catch-all",
      proxyAddress: "127.0.0.1",
      caCertPem: null,
      hostsPath: join(dir, "no-such-dir", "hosts"),
      nsswitchPath: join(dir, "nss3"),
    });
    expect(blocked.code).toBe(1);
    expect(blocked.result).toMatchObject({ ok: false, error: "could not write the hosts file: ENOENT" });
  });

  it("filesFirst puts the hosts file first, whatever the resolver line said", () => {
    expect(filesFirst("")).toBe("hosts:          files dns\n");
    expect(filesFirst("hosts: files dns\n")).toBe("hosts: files dns\n");
    expect(filesFirst("hosts: files mdns4_minimal [NOTFOUND=return] dns\n")).toBe(
      "hosts:          files dns\n",
    );
    // One hosts line only: a later one (which a resolver might read instead) goes.
    expect(filesFirst("passwd: files\nhosts: files dns\nHosts : dns\ngroup: files\n")).toBe(
      "passwd: files\nhosts: files dns\ngroup: files\n",
    );
  });
});
