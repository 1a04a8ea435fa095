import { Agent, type RequestOptions, request } from "node:https";
import { createSecureContext, type SecureContext } from "node:tls";
import autocannon from "autocannon";

// The load generators. Every target is reached the same way: TCP to a loopback address and port,
// TLS with SNI `servername`, `Host: <servername>`. So direct-to-upstream, through the proxy and
// through mitmdump differ only in what listens on the other end.
//
// Each load runs continuously for warm-up + window and counts only what completes inside the
// window. Starting or stopping a load aborts requests in flight, and a proxy answers an abort by
// dropping (and later re-dialling) upstream connections: keeping those edges outside the window
// keeps the bench's own start and stop out of the numbers.

export interface Target {
  name: string;
  address: string;
  port: number;
  servername: string;
  /** Trust root for the certificate the target serves. */
  caPem: string;
}

/** Called when the measured window opens and closes (CPU and counter snapshots). */
export interface WindowHooks {
  start(): void;
  end(): void;
}

export interface RawLoad {
  /** 2xx latencies in the window, milliseconds. */
  latencies: number[];
  ok: number;
  non2xx: number;
  errors: number;
  windowS: number;
}

export interface LoadOptions {
  warmupS: number;
  durationS: number;
  hooks: WindowHooks;
}

const PATH = "/v1/bench";

/** One GET of the bench path to `target`. https.request hands its options to tls.connect,
 * secureContext included; its types omit it, hence the cast. */
const getOptions = (
  target: Target,
  secureContext: SecureContext,
  agent: Agent | false,
  headers: Record<string, string> = {},
): RequestOptions =>
  ({
    host: target.address,
    port: target.port,
    servername: target.servername,
    secureContext,
    agent,
    path: PATH,
    headers: { host: target.servername, ...headers },
    timeout: 10_000,
  }) as RequestOptions;

/** Opens the window after warm-up and closes it after the duration; resolves when closed. */
function measuredWindow(o: LoadOptions, open: (on: boolean) => void): Promise<number> {
  return new Promise((resolve) => {
    setTimeout(() => {
      const t0 = performance.now();
      open(true);
      o.hooks.start();
      setTimeout(() => {
        open(false);
        o.hooks.end();
        resolve((performance.now() - t0) / 1000);
      }, o.durationS * 1000);
    }, o.warmupS * 1000);
  });
}

/**
 * Keep-alive load with autocannon: `connections` persistent TLS connections, one request in
 * flight on each (no pipelining). autocannon does not verify the server certificate (it forces
 * rejectUnauthorized: false); each connection shakes hands once, before the window, so that costs
 * nothing measured, and the new-connection load below does verify.
 */
export async function keepAliveLoad(
  target: Target,
  o: LoadOptions & { connections: number },
): Promise<RawLoad> {
  const raw: RawLoad = { latencies: [], ok: 0, non2xx: 0, errors: 0, windowS: 0 };
  let counting = false;
  const instance = autocannon(
    {
      url: `https://${target.address}:${target.port}${PATH}`,
      connections: o.connections,
      pipelining: 1,
      // Stopped by the window; the duration is only a backstop.
      duration: o.warmupS + o.durationS + 10,
      timeout: 10,
      headers: { host: target.servername },
      servername: target.servername,
      tlsOptions: { ca: target.caPem },
    },
    () => {},
  );
  const finished = new Promise<void>((resolve) => instance.once("done", () => resolve()));
  instance.on("response", (_client, statusCode, _bytes, ms) => {
    if (!counting) return;
    if (statusCode >= 200 && statusCode < 300) {
      raw.ok++;
      raw.latencies.push(ms);
    } else raw.non2xx++;
  });
  instance.on("reqError", () => {
    if (counting) raw.errors++;
  });
  raw.windowS = await measuredWindow(o, (on) => {
    counting = on;
  });
  instance.stop();
  await finished;
  return raw;
}

/**
 * Open-loop keep-alive load at a fixed rate: requests are scheduled every 1/`rate` s whatever the
 * answers do, over up to `connections` keep-alive connections (a request waits for a free one
 * when all are busy), and latency runs from the scheduled time, so a stall is charged to every
 * request it delays. Unlike the closed loop above, which runs the target flat out and so mostly
 * measures queueing, this shows the latency a proxy adds below saturation.
 */
export async function fixedRateLoad(
  target: Target,
  o: LoadOptions & { rate: number; connections: number },
): Promise<RawLoad> {
  const raw: RawLoad = { latencies: [], ok: 0, non2xx: 0, errors: 0, windowS: 0 };
  const agent = new Agent({ keepAlive: true, maxSockets: o.connections, maxFreeSockets: o.connections });
  const secureContext = createSecureContext({ ca: target.caPem });
  let counting = false;
  let inFlight = 0;
  let drained: (() => void) | null = null;
  const fire = (scheduled: number) => {
    inFlight++;
    const done = (outcome: "ok" | "non2xx" | "error") => {
      if (counting) {
        if (outcome === "ok") {
          raw.ok++;
          raw.latencies.push(performance.now() - scheduled);
        } else if (outcome === "non2xx") raw.non2xx++;
        else raw.errors++;
      }
      if (--inFlight === 0) drained?.();
    };
    const req = request(getOptions(target, secureContext, agent), (res) => {
      res.resume();
      res.on("end", () => done(res.statusCode === 200 ? "ok" : "non2xx"));
      res.on("error", () => done("error"));
    });
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", () => done("error"));
    req.end();
  };
  const t0 = performance.now();
  let sent = 0;
  const timer = setInterval(() => {
    const due = Math.floor(((performance.now() - t0) * o.rate) / 1000);
    for (; sent < due; sent++) fire(t0 + (sent * 1000) / o.rate);
  }, 1);
  raw.windowS = await measuredWindow(o, (on) => {
    counting = on;
  });
  clearInterval(timer);
  if (inFlight > 0) await new Promise<void>((resolve) => (drained = resolve));
  agent.destroy();
  return raw;
}

/**
 * A new TLS connection for every request: `concurrency` loops, each doing one verified handshake
 * (SNI `servername`, trusting `caPem`), one request with `Connection: close`, and the close.
 * autocannon cannot do this (its reconnectRate drops the response it reconnects after), so the
 * direct baseline is measured with this same loop. One client SecureContext is shared, as a real
 * client's would be; no TLS session is resumed.
 */
export async function newConnectionLoad(
  target: Target,
  o: LoadOptions & { concurrency: number },
): Promise<RawLoad> {
  const raw: RawLoad = { latencies: [], ok: 0, non2xx: 0, errors: 0, windowS: 0 };
  const secureContext: SecureContext = createSecureContext({ ca: target.caPem });
  let counting = false;
  let running = true;
  const one = () =>
    new Promise<void>((resolve) => {
      const t0 = performance.now();
      const req = request(getOptions(target, secureContext, false, { connection: "close" }), (res) => {
        res.resume();
        res.on("end", () => {
          if (counting) {
            if (res.statusCode === 200) {
              raw.ok++;
              raw.latencies.push(performance.now() - t0);
            } else raw.non2xx++;
          }
          resolve();
        });
        res.on("error", () => {
          if (counting) raw.errors++;
          resolve();
        });
      });
      req.on("timeout", () => req.destroy(new Error("timeout")));
      req.on("error", () => {
        if (counting) raw.errors++;
        resolve();
      });
      req.end();
    });
  const loop = async () => {
    while (running) await one();
  };
  const loops = Promise.all(Array.from({ length: o.concurrency }, loop));
  raw.windowS = await measuredWindow(o, (on) => {
    counting = on;
  });
  // Let the requests in flight finish (uncounted) instead of aborting them.
  running = false;
  await loops;
  return raw;
}

/**
 * Opens `count` keep-alive TLS connections (each has served requests, so each is a real
 * keep-alive connection with the proxy's per-connection state), `concurrency` at a time, and
 * leaves them idle. One agent per connection, so none is reused for another.
 */
export async function openIdleConnections(
  target: Target,
  o: { count: number; concurrency: number; maxS: number },
) {
  const agents: Agent[] = [];
  const secureContext = createSecureContext({ ca: target.caPem });
  let failed = 0;
  const one = (agent: Agent) =>
    new Promise<void>((resolve) => {
      const req = request(getOptions(target, secureContext, agent), (res) => {
        res.resume();
        res.on("end", () => {
          if (res.statusCode !== 200) failed++;
          resolve();
        });
      });
      req.on("timeout", () => req.destroy(new Error("timeout")));
      req.on("error", () => {
        failed++;
        resolve();
      });
      req.end();
    });
  // The proxy closes a keep-alive connection after 5 s idle (and Node's client after 4 s, from the
  // proxy's Keep-Alive hint), and opening 1,000 TLS connections on two shared cores can take
  // longer than that. So the same workers that open connections first give any connection idle
  // for 2.5 s one more request (no handshake), and all are still open when memory is read.
  const lastUsed: number[] = [];
  const isOpen = (a: Agent | undefined) =>
    a !== undefined &&
    Object.values(a.freeSockets)
      .flat()
      .some((sock) => sock && !sock.destroyed);
  const started = performance.now();
  // Bounded: on a busy machine, stop opening after maxS and report how many there are.
  const deadline = started + o.maxS * 1000;
  let next = 0;
  let scan = 0;
  const stale = (): number | null => {
    // Round-robin over the opened connections, oldest first in practice.
    for (let k = 0; k < next; k++) {
      const i = (scan + k) % next;
      const t = lastUsed[i];
      if (t !== undefined && performance.now() - t > 2_500) {
        scan = i + 1;
        lastUsed[i] = Number.POSITIVE_INFINITY; // claimed by this worker (or given up, below)
        // One that closed anyway is not opened again: that would cost a handshake, and opening
        // is what is slow. It is simply not counted as open.
        if (isOpen(agents[i])) return i;
      }
    }
    return null;
  };
  const worker = async () => {
    for (;;) {
      const i = stale() ?? (next < o.count && performance.now() < deadline ? next++ : null);
      if (i === null) return;
      agents[i] ??= new Agent({ keepAlive: true, maxSockets: 1, maxFreeSockets: 1 });
      await one(agents[i] as Agent);
      lastUsed[i] = performance.now();
    }
  };
  await Promise.all(Array.from({ length: o.concurrency }, worker));
  const openMs = performance.now() - started;
  return {
    failed,
    openMs,
    /** Connections still open and idle in their agents. */
    open: () => agents.filter(isOpen).length,
    close: () => {
      for (const a of agents) a.destroy();
    },
  };
}

function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] as number;
}

export interface LoadResult {
  /** 2xx responses per second over the measured windows. */
  rps: number;
  /** Latency of 2xx responses, milliseconds. */
  p50Ms: number;
  p99Ms: number;
  ok: number;
  non2xx: number;
  errors: number;
  /** Seconds measured, over all rounds. */
  durationS: number;
}

/** Pools the windows of several rounds of one load into one result. */
export function summarise(rounds: readonly RawLoad[]): LoadResult {
  const sorted = Float64Array.from(rounds.flatMap((r) => r.latencies)).sort();
  const sum = (f: (r: RawLoad) => number) => rounds.reduce((n, r) => n + f(r), 0);
  const durationS = sum((r) => r.windowS);
  return {
    rps: sum((r) => r.ok) / durationS,
    p50Ms: percentile(sorted, 50),
    p99Ms: percentile(sorted, 99),
    ok: sum((r) => r.ok),
    non2xx: sum((r) => r.non2xx),
    errors: sum((r) => r.errors),
    durationS,
  };
}
