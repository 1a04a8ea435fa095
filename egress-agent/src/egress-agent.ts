import { lookup as dnsLookup } from "node:dns/promises";
import {
  createServer as createHttp2Server,
  constants as h2,
  type IncomingHttpHeaders,
  type ServerHttp2Session,
  type ServerHttp2Stream,
} from "node:http2";
import { connect as netConnect, type Socket } from "node:net";
import { networkInterfaces } from "node:os";
import { pipeline } from "node:stream";
import {
  type HostPatternResult,
  isCanonicalIp,
  isCanonicalPattern,
  splitHostPort,
} from "@benchwright/shared/contract/host-name";
import { type LogRecord, levelOf, logLine } from "@benchwright/shared/contract/log";
import { bearer } from "@benchwright/shared/contract/proxy-wire";
import {
  AgentPolicy,
  CLOSE_REPLACED,
  CLOSE_RUN_ENDED,
  CLOSE_TOKEN_REVOKED,
  EGRESS_AGENT_PATH,
  EGRESS_AGENT_POLICY_PATH,
  EgressToken,
  MAX_TUNNEL_MESSAGE,
  PAIRED,
  REFUSAL_HEADER,
  REFUSAL_STATUS,
  SESSION_WINDOW,
  STREAM_WINDOW,
  TUNNEL_PORTS,
  type TunnelRefusal,
  toWebSocketUrl,
} from "@benchwright/shared/contract/tunnel";
import { createAddressPolicy } from "@benchwright/shared/node/address-policy";
import { buildAddressBlocker, buildHostDecider, type HostDecision } from "@benchwright/shared/policy/compile";
import { matchesCanonical, parseHostPattern } from "@benchwright/shared/policy/host";
import { createWebSocketStream, WebSocket } from "ws";

// The local egress agent: what the user runs on their own machine so that a run's hosts routed
// "via tunnel" leave from there (shared/contract/tunnel.ts). It dials the control plane's relay (the
// user's machine accepts no connection), and serves HTTP/2 (node:http2: in Node core, its flow
// control is the back-pressure) over the WebSocket's bytes once the relay says PAIRED. Each
// CONNECT stream is one TCP connection it dials for the run's proxy, which then speaks TLS with
// the upstream inside the stream: the agent sees host names and byte counts, never a request.
//
// What it dials is decided here, on the user's side, whatever the proxy asks for: the run's host
// policy (polled; until one has been read everything is refused), the user's own --block list,
// ports 443 and 80 only, and every resolved address checked — loopback, link-local and metadata,
// private ranges (unless --allow-cidr names them) and the machine's own addresses are refused.
// One JSON line per decision on stdout; never the token.

export type AgentLog = (record: LogRecord) => void;
export type LookupAll = (host: string) => Promise<Array<{ address: string; family: number }>>;

export interface EgressAgentOptions {
  /** The control plane's base URL (http(s)://...). */
  url: string;
  /** The run's egress token (`bwe_...`). */
  token: string;
  /** Private ranges on the user's network the agent may dial (CIDRs). */
  allowCidrs?: readonly string[];
  /** The user's own blocks: canonical host patterns, exact or `*.x` (see parseBlockPattern). */
  block?: readonly string[];
  /** Policy poll interval. Default 2000. */
  policyIntervalMs?: number;
  /** One record per line; default JSON lines on stdout. */
  log?: AgentLog;
  /** Injectable for tests; default dns.lookup({ all: true, verbatim: true }). */
  lookup?: LookupAll;
  /**
   * Injectable for tests: dials the checked address. The suite's upstreams listen on ephemeral
   * ports, so its dial maps 443/80 to them; the address is never changed.
   */
  dial?: (address: string, port: number) => Socket;
  /** Addresses never dialled. Default: this machine's non-loopback interface addresses. */
  ownAddresses?: readonly string[];
  /** Defaults 8000 and 5000: together under the proxy's 15 s wait for an answer. */
  dialTimeoutMs?: number;
  dnsTimeoutMs?: number;
  reconnectMs?: { min: number; max: number };
  fetch?: typeof fetch;
}

export interface EgressAgent {
  stop(): Promise<void>;
  /** Resolves with the exit code: 0 the run ended (or stop()), 1 the token no longer works. */
  done: Promise<number>;
}

const EXIT_WHY = {
  ended: "the run ended",
  revoked: "the token was revoked or the run is over",
  replaced: "another egress agent connected with this token",
  stopped: "stopped",
} as const;

/** A --block value as the canonical pattern it means, or a message saying what to write instead. */
export function parseBlockPattern(input: string): HostPatternResult {
  return parseHostPattern(input, "host-entry");
}

/** The machine's own addresses, loopback excluded (loopback is refused by range unless allowed). */
export function ownInterfaceAddresses(): string[] {
  const out: string[] = [];
  for (const entries of Object.values(networkInterfaces())) {
    for (const entry of entries ?? []) {
      if (!entry.internal) out.push(entry.address.replace(/%.*$/, ""));
    }
  }
  return out;
}

const systemLookup: LookupAll = (host) => dnsLookup(host, { all: true, verbatim: true });

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} timed out after ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

class Refusal extends Error {
  constructor(
    readonly kind: TunnelRefusal,
    readonly detail: string,
  ) {
    super(detail);
  }
}

export function startEgressAgent(options: EgressAgentOptions): EgressAgent {
  if (!EgressToken.safeParse(options.token).success)
    throw new Error("the token is not an egress agent token");
  for (const pattern of options.block ?? []) {
    if (!isCanonicalPattern(pattern)) throw new Error(`not a canonical host pattern: ${pattern}`);
  }
  const wsUrl = toWebSocketUrl(options.url, EGRESS_AGENT_PATH);
  const policyUrl = `${options.url.replace(/\/+$/, "")}${EGRESS_AGENT_POLICY_PATH}`;
  const log: AgentLog =
    options.log ?? ((record) => process.stdout.write(`${logLine(levelOf(record), record)}\n`));
  const lookup = options.lookup ?? systemLookup;
  const dial = options.dial ?? ((address: string, port: number) => netConnect({ host: address, port }));
  const fetchFn = options.fetch ?? fetch;
  const block = [...(options.block ?? [])];
  const addressPolicy = createAddressPolicy({
    ownAddresses: options.ownAddresses ?? ownInterfaceAddresses(),
    // The user's explicit --allow-cidr ranges, opened by the only person whose network it is.
    allowCidrs: options.allowCidrs ?? [],
  });

  // An IP literal blocked (by the run's policy or --block) is blocked under every name that
  // resolves to it, in every spelling of the address (case I5).
  const blockedByUser = buildAddressBlocker(block.map((pattern) => ({ pattern, action: "block" })));
  let blockedByPolicy: (address: string) => string | null = () => null;
  let decide: ((host: string) => HostDecision) | null = null;
  let policyVersion: number | null = null;
  let ws: WebSocket | null = null;
  let session: ServerHttp2Session | null = null;
  let stopped = false;
  let failures = 0;
  let reconnectTimer: NodeJS.Timeout | null = null;
  let pollTimer: NodeJS.Timeout | null = null;
  let pingTimer: NodeJS.Timeout | null = null;
  const upstreams = new Set<Socket>();
  let resolveDone: (code: number) => void = () => {};
  const done = new Promise<number>((resolve) => {
    resolveDone = resolve;
  });

  const server = createHttp2Server({
    maxSessionMemory: 64,
    settings: { initialWindowSize: STREAM_WINDOW, maxConcurrentStreams: 1024, enablePush: false },
  });
  server.on("stream", (stream, headers) => {
    stream.on("error", () => {}); // a reset by the proxy ends the stream; nothing to report
    void handle(stream, headers);
  });

  function exit(code: number, why: string): void {
    if (stopped) return;
    stopped = true;
    if (reconnectTimer) clearTimeout(reconnectTimer);
    if (pollTimer) clearTimeout(pollTimer);
    if (pingTimer) clearInterval(pingTimer);
    session?.destroy();
    session = null;
    for (const socket of upstreams) socket.destroy();
    const socket = ws;
    ws = null;
    if (socket && socket.readyState !== WebSocket.CLOSED) {
      socket.close(1000, "agent stopping");
      const force = setTimeout(() => socket.terminate(), 2_000);
      socket.once("close", () => clearTimeout(force));
    }
    log({ event: "stopped", code, why });
    resolveDone(code);
  }

  // ---- policy ----

  async function poll(): Promise<void> {
    if (stopped) return;
    try {
      const response = await fetchFn(policyUrl, {
        headers: { authorization: bearer(options.token) },
        signal: AbortSignal.timeout(10_000),
      });
      if (response.status === 401 || response.status === 404) {
        await response.body?.cancel();
        exit(1, EXIT_WHY.revoked);
        return;
      }
      if (!response.ok) {
        await response.body?.cancel();
        // Not an answer about the policy: keep what is in force.
        log({ event: "policy_error", status: response.status });
        return;
      }
      const parsed = AgentPolicy.safeParse(await response.json().catch(() => undefined));
      if (stopped) return;
      if (!parsed.success) {
        // A document that does not validate is an answer: fail closed until a good one comes.
        decide = null;
        blockedByPolicy = () => null;
        policyVersion = null;
        log({ event: "policy_invalid" });
        return;
      }
      if (parsed.data.version !== policyVersion || decide === null) {
        decide = buildHostDecider(parsed.data);
        blockedByPolicy = buildAddressBlocker(parsed.data.hosts);
        policyVersion = parsed.data.version;
        log({ event: "policy", version: parsed.data.version, runId: parsed.data.runId });
      }
    } catch (error) {
      log({ event: "policy_error", message: (error as Error).message.slice(0, 200) });
    } finally {
      if (!stopped) pollTimer = setTimeout(() => void poll(), options.policyIntervalMs ?? 2_000);
    }
  }

  // ---- one CONNECT stream ----

  async function handle(stream: ServerHttp2Stream, headers: IncomingHttpHeaders): Promise<void> {
    const authority = headers[h2.HTTP2_HEADER_AUTHORITY];
    const split =
      headers[h2.HTTP2_HEADER_METHOD] === "CONNECT" && typeof authority === "string"
        ? splitHostPort(authority)
        : null;
    const host = split?.host ?? String(authority ?? "").slice(0, 260);
    const port = split?.port ?? null;
    let upstream: Socket | null = null;
    try {
      if (split === null || port === null || !TUNNEL_PORTS.includes(port)) {
        throw new Refusal("bad_target", "not a CONNECT to host:443 or host:80");
      }
      if (decide === null) throw new Refusal("blocked", "no policy read yet");
      if (decide(split.host).action === "block") throw new Refusal("blocked", "the run's policy");
      if (block.some((pattern) => matchesCanonical(pattern, split.host))) {
        throw new Refusal("blocked", "--block");
      }
      const address = await resolve(split.host);
      if (stream.closed) return;
      upstream = await connectTo(address, port, stream);
      if (stream.closed) {
        upstream.destroy();
        return;
      }
    } catch (error) {
      const refusal =
        error instanceof Refusal ? error : new Refusal("unreachable", (error as Error).message.slice(0, 120));
      log({ event: "refused", host, port, why: refusal.kind, detail: refusal.detail });
      if (!stream.closed && !stream.headersSent) {
        stream.respond(
          { [h2.HTTP2_HEADER_STATUS]: REFUSAL_STATUS[refusal.kind], [REFUSAL_HEADER]: refusal.kind },
          { endStream: true },
        );
      }
      return;
    }
    log({ event: "allowed", host, port });
    stream.respond({ [h2.HTTP2_HEADER_STATUS]: 200 });
    const socket = upstream;
    upstreams.add(socket);
    // Both directions with back-pressure; when either side fails or closes, both go.
    pipeline(stream, socket, stream, () => {
      socket.destroy();
      if (!stream.destroyed) stream.close(h2.NGHTTP2_NO_ERROR);
    });
    socket.once("close", () => upstreams.delete(socket));
    // A reset by the proxy (or the session going away) ends the upstream connection at once.
    stream.once("close", () => socket.destroy());
  }

  /** The first of the host's addresses, after every one of them passed the address policy. */
  async function resolve(host: string): Promise<string> {
    let answers: string[];
    if (isCanonicalIp(host)) {
      answers = [host.replace(/^\[|\]$/g, "")];
    } else {
      try {
        answers = (await withTimeout(lookup(host), options.dnsTimeoutMs ?? 5_000, "DNS lookup")).map(
          (a) => a.address,
        );
      } catch (error) {
        throw new Refusal("dns", (error as Error).message.slice(0, 120));
      }
      if (answers.length === 0) throw new Refusal("dns", "no addresses");
    }
    // Every answer: a set mixing public and private addresses is a rebinding attempt.
    for (const address of answers) {
      if (blockedByPolicy(address) !== null) throw new Refusal("blocked", `the run's policy (${address})`);
      if (blockedByUser(address) !== null) throw new Refusal("blocked", `--block (${address})`);
      const verdict = addressPolicy.check(address);
      if (!verdict.allowed) throw new Refusal("address", `${address} is ${verdict.reason}`);
    }
    return answers[0] as string;
  }

  function connectTo(address: string, port: number, stream: ServerHttp2Stream): Promise<Socket> {
    return new Promise<Socket>((resolvePromise, reject) => {
      const socket = dial(address, port);
      const timeoutMs = options.dialTimeoutMs ?? 8_000;
      const fail = (detail: string) => {
        cleanup();
        socket.destroy();
        reject(new Refusal("unreachable", detail));
      };
      const onConnect = () => {
        cleanup();
        resolvePromise(socket);
      };
      const onError = (error: Error) => fail(`connecting to ${address}: ${error.message.slice(0, 120)}`);
      const onStreamClose = () => fail("the proxy gave up");
      const timer = setTimeout(() => fail(`connecting to ${address} timed out`), timeoutMs);
      function cleanup() {
        clearTimeout(timer);
        socket.off("connect", onConnect);
        socket.off("error", onError);
        stream.off("close", onStreamClose);
      }
      socket.once("connect", onConnect);
      socket.once("error", onError);
      stream.once("close", onStreamClose);
      socket.on("error", () => {}); // after connecting, the pipeline reports (and handles) errors
    });
  }

  // ---- the relay connection ----

  function connect(): void {
    if (stopped) return;
    const socket = new WebSocket(wsUrl, {
      headers: { authorization: bearer(options.token) },
      perMessageDeflate: false,
      maxPayload: MAX_TUNNEL_MESSAGE,
      handshakeTimeout: 10_000,
    });
    ws = socket;
    const current = () => ws === socket;
    socket.on("unexpected-response", (_request, response) => {
      const status = response.statusCode ?? 0;
      response.resume();
      if (current()) {
        log({ event: "refused_upgrade", status });
        if (status === 401 || status === 404) exit(1, EXIT_WHY.revoked);
      }
      // Handling this event leaves the socket connecting for ever: terminate() gives the 'close'
      // (and with it the next attempt, unless we just exited).
      socket.terminate();
    });
    socket.on("open", () => {
      if (current()) log({ event: "connected" });
    });
    socket.on("message", (data, isBinary) => {
      if (!current() || isBinary || data.toString() !== PAIRED) return;
      if (session) {
        // A second PAIRED on a socket that carried the old session: start over cleanly.
        socket.terminate();
        return;
      }
      failures = 0;
      // Synchronously here: the proxy's connection preface may be the very next message.
      const duplex = createWebSocketStream(socket);
      duplex.on("error", () => {});
      server.once("session", (s: ServerHttp2Session) => {
        session = s;
        s.on("error", (error) => log({ event: "session_error", message: error.message.slice(0, 200) }));
        s.once("localSettings", () => s.setLocalWindowSize(SESSION_WINDOW));
        s.on("close", () => {
          if (session === s) session = null;
          if (current()) socket.terminate();
        });
      });
      server.emit("connection", duplex);
      log({ event: "paired" });
    });
    socket.on("error", (error) => {
      if (current()) log({ event: "connection_error", message: error.message.slice(0, 200) });
    });
    socket.on("close", (code) => {
      if (!current()) return;
      ws = null;
      session?.destroy();
      session = null;
      if (stopped) return;
      log({ event: "disconnected", code });
      if (code === CLOSE_RUN_ENDED) return exit(0, EXIT_WHY.ended);
      if (code === CLOSE_TOKEN_REVOKED) return exit(1, EXIT_WHY.revoked);
      if (code === CLOSE_REPLACED) return exit(1, EXIT_WHY.replaced);
      const { min, max } = options.reconnectMs ?? { min: 250, max: 10_000 };
      const ceiling = Math.min(max, min * 2 ** Math.min(failures, 20));
      failures += 1;
      reconnectTimer = setTimeout(
        () => {
          reconnectTimer = null;
          connect();
        },
        Math.round(ceiling / 2 + (Math.random() * ceiling) / 2),
      );
    });
  }

  // Keeps a waiting (unpaired) socket alive through intermediaries that close idle connections.
  pingTimer = setInterval(() => {
    if (ws?.readyState === WebSocket.OPEN) ws.ping();
  }, 30_000);
  pingTimer.unref();

  void poll();
  connect();

  return {
    done,
    async stop() {
      const socket = ws;
      exit(0, EXIT_WHY.stopped);
      if (socket && socket.readyState !== WebSocket.CLOSED) {
        await new Promise<void>((resolve) => socket.once("close", () => resolve()));
      }
    },
  };
}
