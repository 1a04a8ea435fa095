import { spawn } from "node:child_process";
import { X509Certificate } from "node:crypto";
import { EventEmitter, once } from "node:events";
import { connect as tlsConnect } from "node:tls";
import { describe, expect, it } from "vitest";
import { startProxy, vault } from "./harness";
import {
  AGENT_TOKEN,
  caPem,
  cleanups,
  type LogRecord,
  newClient,
  newRelay,
  refusalOf,
  tunnel,
  useTunnelWorld,
} from "./tunnel-world";

// The egress agent as the built command, and a tunnelled host spliced through the tunnel (I3),
// in the same loopback world as tunnel.test.ts (tunnel-world.ts). Few agents run in-process here,
// so the token canary asks only that none of their lines carries a token.

useTunnelWorld(0);

describe("egress agent: the command", () => {
  const BIN = "proxy-image/dist/egress-agent.cjs";
  function run(args: string[], env: Record<string, string> = {}, input?: string) {
    const child = spawn(process.execPath, [BIN, ...args], {
      env: { PATH: process.env.PATH ?? "", ...env },
      stdio: ["pipe", "pipe", "pipe"],
    });
    child.stdin.end(input ?? "");
    let stdout = "";
    let stderr = "";
    const lines = new EventEmitter();
    child.stdout.on("data", (d: Buffer) => {
      stdout += d.toString();
      lines.emit("data");
    });
    child.stderr.on("data", (d: Buffer) => {
      stderr += d.toString();
    });
    const exit = once(child, "exit").then(([code]) => code as number);
    cleanups.push(() => child.exitCode === null && child.kill());
    const until = (text: string) =>
      stdout.includes(text)
        ? Promise.resolve()
        : new Promise<void>((resolve) => {
            const on = () => {
              if (!stdout.includes(text)) return;
              lines.off("data", on);
              resolve();
            };
            lines.on("data", on);
          });
    return { exit, until, out: () => stdout, err: () => stderr };
  }

  it("refuses a bad flag with exit 2, naming the flag and never the token", async () => {
    const env = { BENCHWRIGHT_EGRESS_TOKEN: AGENT_TOKEN };
    const cases: Array<[string[], RegExp, Record<string, string>?]> = [
      [
        ["--url", "https://cp.example"],
        /BENCHWRIGHT_EGRESS_TOKEN is not/,
        { BENCHWRIGHT_EGRESS_TOKEN: "bwe_short" },
      ],
      [["--url", "https://cp.example"], /no token: set BENCHWRIGHT_EGRESS_TOKEN/, {}],
      [["--url", "http://cp.example"], /--url/],
      [["--url", "https://cp.example", "--allow-cidr", "10.0.0/8"], /--allow-cidr/],
      [["--url", "https://cp.example", "--block", "*.com"], /--block/],
      [["--url", "https://cp.example", "--policy-interval-ms", "5"], /--policy/],
      [["--url", "https://cp.example", `--tokn=${AGENT_TOKEN}`], /unknown flag --tokn/],
      [["--url", "https://cp.example", AGENT_TOKEN], /unexpected argument/],
    ];
    const children = cases.map(([args, , own]) => run(args, own ?? env));
    for (const [i, [, message]] of cases.entries()) {
      const child = children[i] as ReturnType<typeof run>;
      expect(await child.exit).toBe(2);
      expect(child.err()).toMatch(message);
      expect(child.err() + child.out()).not.toContain(AGENT_TOKEN);
    }
  }, 20_000);

  it("case K5: --token is refused (exit 2) with a message pointing at the environment, never echoing it", async () => {
    for (const args of [
      ["--url", "https://cp.example", "--token", AGENT_TOKEN],
      ["--url", "https://cp.example", `--token=${AGENT_TOKEN}`],
    ]) {
      const child = run(args);
      expect(await child.exit).toBe(2);
      expect(child.err()).toContain("--token is refused");
      expect(child.err()).toContain("BENCHWRIGHT_EGRESS_TOKEN");
      expect(child.err() + child.out()).not.toContain(AGENT_TOKEN);
    }
  }, 20_000);

  it("case K5: --token-stdin reads the token from standard input and runs", async () => {
    const relay = await newRelay();
    const child = run(
      ["--token-stdin", "--allow-cidr", "127.0.0.0/8", "--policy-interval-ms", "200"],
      {
        BENCHWRIGHT_URL: relay.url,
      },
      `${AGENT_TOKEN}\n`,
    );
    await child.until('"event":"policy"');
    relay.endRun();
    expect(await child.exit).toBe(0);
    expect(child.out() + child.err()).not.toContain(AGENT_TOKEN);
    // An empty standard input is a usage error, as a missing variable is.
    const empty = run(["--url", "https://cp.example", "--token-stdin"], {}, "");
    expect(await empty.exit).toBe(2);
    expect(empty.err()).toContain("standard input held no token");
  }, 20_000);

  it("runs from the environment, logs JSON lines without the token, exits 0 when the run ends", async () => {
    const relay = await newRelay();
    const child = run(["--allow-cidr", "127.0.0.0/8", "--policy-interval-ms", "200"], {
      BENCHWRIGHT_URL: relay.url,
      BENCHWRIGHT_EGRESS_TOKEN: AGENT_TOKEN,
    });
    await child.until('"event":"policy"');
    const proxy = newClient(relay);
    await proxy.until(true);
    // No test lookup in the real binary: an IP literal on loopback, allowed by --allow-cidr,
    // with nothing listening on port 80 of 127.0.0.3.
    expect((await refusalOf(proxy.client.open("127.0.0.3", 80))).kind).toBe("unreachable");
    relay.endRun();
    expect(await child.exit).toBe(0);
    const lines = child
      .out()
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as LogRecord);
    expect(lines.map((l) => l.event)).toEqual(
      expect.arrayContaining(["connected", "policy", "paired", "refused", "disconnected", "stopped"]),
    );
    // Every line has a level and a timestamp (shared/contract/log.ts).
    for (const l of lines as Array<LogRecord & { level?: unknown; ts?: unknown }>) {
      expect(["debug", "info", "warn", "error"]).toContain(l.level);
      expect(Number.isNaN(Date.parse(String(l.ts)))).toBe(false);
    }
    expect(lines.find((l) => l.event === "disconnected")).toMatchObject({ level: "warn" });
    expect(child.err()).toContain("the run ended");
    expect(child.out() + child.err()).not.toContain(AGENT_TOKEN);
  }, 20_000);
});

describe("case I3: a tunnelled host is spliced through the egress tunnel", () => {
  /** The whole proxy (catch-all: egress through the tunnel forces it) over a paired tunnel. */
  async function proxyOverTunnel() {
    const parts = await tunnel();
    const running = await startProxy({
      vault: vault({
        default: "block",
        hosts: [
          { pattern: "api.test", action: "allow", via: "tunnel" },
          // Allowed by the vault, refused by the user's agent (BASE_POLICY blocks it there).
          { pattern: "blocked.test", action: "allow", via: "tunnel" },
        ],
      }),
      upstream: { tunnel: parts.proxy.client },
    });
    cleanups.push(() => running.close());
    return { ...parts, running };
  }

  /** One HTTP/1.1 GET over TLS to the proxy's transparent listener, trusting only `ca`. */
  function getOverTls(port: number, host: string, ca: string) {
    return new Promise<{ issuer: string; text: string }>((resolve, reject) => {
      const s = tlsConnect({ host: "127.0.0.1", port, servername: host, ca, ALPNProtocols: ["http/1.1"] });
      let text = "";
      let issuer = "";
      s.once("secureConnect", () => {
        issuer = new X509Certificate(s.getPeerCertificate(true).raw).issuer;
        s.write(`GET /hello HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
      });
      s.setEncoding("utf8");
      s.on("data", (d: string) => {
        text += d;
      });
      s.once("end", () => resolve({ issuer, text }));
      s.once("error", reject);
    });
  }

  it("case I3: the client's TLS goes to the upstream inside the tunnel, untouched; routed tunnel", async () => {
    const { agent, running } = await proxyOverTunnel();
    // The client trusts only the upstream's CA: a handshake that completes was not terminated.
    const got = await getOverTls(running.tlsPort, "api.test", caPem);
    expect(got.text).toMatch(/^HTTP\/1\.1 200 /);
    expect(got.text).toContain("hello from api.test");
    expect(got.issuer).not.toBe(new X509Certificate(running.caPem).subject);
    const record = await running.waitForLog((r) => r.mode === "splice" && r.host === "api.test");
    expect(record).toMatchObject({ decision: "allow", reason: "spliced", route: "tunnel", method: "TLS" });
    expect(running.audit.routes).toContainEqual(["api.test", "tunnel"]);
    // The agent made the connection, on the user's machine; the proxy dialled nothing itself.
    expect(agent.log.records).toContainEqual({ event: "allowed", host: "api.test", port: 443 });
    expect(running.dials).toEqual([]);
  });

  it("case I3: a host the user's agent refuses is terminated instead and refused readably", async () => {
    const { agent, running } = await proxyOverTunnel();
    const got = await getOverTls(running.tlsPort, "blocked.test", running.caPem);
    // Terminated: the run CA signed what the client saw, and the refusal is an HTTP answer.
    expect(got.issuer).toBe(new X509Certificate(running.caPem).subject);
    expect(got.text).toMatch(/^HTTP\/1\.1 403 /);
    const record = await running.waitForLog((r) => r.host === "blocked.test" && r.mode === "terminate");
    expect(record).toMatchObject({ decision: "block" });
    expect(running.logs.filter((r) => r.mode === "splice" && r.host === "blocked.test")).toEqual([]);
    expect(
      agent.log.records.filter((r) => r.event === "refused" && r.host === "blocked.test").length,
    ).toBeGreaterThan(0);
  });
});
