import type { Server, Socket } from "node:net";
import type { Duplex } from "node:stream";
import { createSecureContext, TLSSocket } from "node:tls";
import { canonicalHost } from "@benchwright/shared/contract/host-name";
import type { LogRecord } from "@benchwright/shared/contract/log";
import { MODEL_LANE_HOST, WIRING_PROBE_HOST } from "@benchwright/shared/contract/proxy-wire";
import type { RunCa } from "../ca";
import type { OriginalDst } from "../original-dst";
import type { PolicyState } from "../policy-client";
import { TunnelError } from "../tunnel-client";
import { readClientHello } from "./client-hello";
import type { ConnInfo } from "./connections";
import { type Decision, decide, decideDialed, destination, spliceable } from "./decide";
import type { Gate } from "./gate";
import type { createStreamServer } from "./h2";
import { type DecisionRecord, type Listener, type RecordInput, record } from "./record";
import { Refusal } from "./refusal";
import { relay } from "./splice";
import { helloTarget } from "./target";

// The proxy's TLS ways in, before any HTTP: a connection is read up to its ClientHello when there
// is a splice decision to make (catch-all, I3; a connection dialled by address, I4), then either
// relayed untouched (splice.ts) or handed to the TLS terminator, whose decrypted connections go
// to the one HTTP/1.1 handler (h1.ts), or, when ALPN chose h2, to the stream server (h2.ts, I1).

export interface TlsWaysInDeps {
  ca: RunCa;
  /** Relay allowed hosts without a rule untouched (BW_SPLICE). */
  splice: boolean;
  originalDst: OriginalDst | null;
  limits: { handshakeTimeoutMs: number; spliceIdleTimeoutMs: number };
  /** Lines that are not a decision (a TLS error). */
  log: (line: LogRecord) => void;
  /** The HTTP server decrypted HTTP/1.1 connections are handed to (it never listens itself). */
  inner: Server;
  /** Where decrypted connections whose ALPN chose h2 go (h2.ts, I1). */
  streams: ReturnType<typeof createStreamServer>;
  /** A direct connection with no original destination: logged and closed. */
  notDialed: (socket: Socket, listener: Listener) => void;
}

export function tlsWaysIn(gate: Gate, deps: TlsWaysInDeps) {
  const { limits, log, inner, streams, notDialed } = deps;
  const { conns } = gate;
  const noCertContext = createSecureContext({});

  /** `onFail`: what to record when the handshake fails (a refusal decided on the ClientHello). */
  function terminateTls(
    raw: Socket,
    conn: Omit<ConnInfo, "id" | "policyVersion">,
    onFail?: (code: string) => void,
  ): void {
    const tls = new TLSSocket(raw, {
      isServer: true,
      // Shared placeholder until SNI picks the leaf: without it Node builds a context per connection.
      secureContext: noCertContext,
      // h2 when the client offers it, for every host but the platform's own (their lanes speak
      // HTTP/1.1); no ALPN at all from the client means HTTP/1.1, as always.
      ALPNCallback: ({ servername, protocols }) => {
        const host = canonicalHost(servername ?? "");
        if (protocols.includes("h2") && host !== WIRING_PROBE_HOST && host !== MODEL_LANE_HOST) return "h2";
        return protocols.includes("http/1.1") ? "http/1.1" : undefined;
      },
      SNICallback: (servername, cb) => {
        const host = canonicalHost(servername);
        if (!host) return cb(new Error("SNI is not a valid host name"), undefined);
        // A name the policy gained after the CA was made under default routing (N5): the CA's
        // constraints leave it out, so no client would accept a leaf; the handshake ends here.
        if (!deps.ca.permits(host)) return cb(outsideRunCa(host), undefined);
        deps.ca.contextFor(host).then(
          (ctx) => cb(null, ctx),
          (e: Error) => cb(e, undefined),
        );
      },
    });
    conns.track(tls, conn.listener, conn);
    let secured = false;
    const handshake = setTimeout(() => {
      onFail?.("handshake timeout");
      onFail = undefined;
      tls.destroy();
    }, limits.handshakeTimeoutMs);
    tls.once("secure", () => {
      clearTimeout(handshake);
      secured = true;
      const conn = conns.of(tls);
      if (tls.alpnProtocol === "h2" && conn) streams.serve(tls, conn);
      else inner.emit("connection", tls);
    });
    // A client that rejects the run CA often just hangs up, with no alert and no error here.
    tls.once("close", () => {
      clearTimeout(handshake);
      if (!secured) onFail?.("closed during the handshake");
      onFail = undefined;
    });
    tls.on("error", (e: Error & { code?: string; host?: string }) => {
      clearTimeout(handshake);
      // A client that does not trust the run CA, no SNI, a bad handshake: nothing was forwarded.
      log({
        event: "tls_error",
        conn: conns.of(tls)?.id ?? 0,
        listener: conn.listener,
        code: e.code ?? e.message,
        ...(e.code === OUTSIDE_RUN_CA ? { host: e.host } : {}),
      });
      // Once the handshake is done, each request records itself.
      if (!secured) onFail?.(e.code ?? e.message);
      onFail = undefined;
      tls.destroy();
      raw.destroy();
    });
  }

  /**
   * A TLS connection on either way in: spliced when its ClientHello names a host that decide.ts
   * lets through untouched (I3), else terminated. Only under catch-all routing is the
   * ClientHello read first; otherwise the connection goes straight to termination, as always.
   */
  function acceptTls(raw: Socket, conn: Omit<ConnInfo, "id" | "policyVersion">): void {
    const state = gate.context().policy;
    if (!deps.splice || state.kind !== "ready" || state.policy.routing.mode !== "catch-all") {
      terminateTls(raw, conn);
      return;
    }
    readClientHello(raw, limits.handshakeTimeoutMs).then(
      (read) => {
        const ctx = gate.context();
        const host =
          read.parse.status === "done" && !read.parse.ech ? helloTarget(read.parse.sni, conn) : null;
        const decided = host === null ? null : spliceable(host, ctx);
        if (host === null || decided === null) {
          // Not spliced: the very bytes read go to the TLS terminator, which decides per request.
          // A blocked SNI whose client then refuses the run CA sends no request to decide on: the
          // refusal is recorded from the ClientHello instead, as the direct listeners do.
          const refused = host === null ? null : decide({ host, port: 443, scheme: "https", path: "/" }, ctx);
          raw.unshift(read.bytes);
          return terminateTls(
            raw,
            conn,
            refused?.kind === "refuse" && host !== null
              ? (code) =>
                  gate.emit(
                    record({
                      conn: conns.of(raw) ?? conns.track(raw, conn.listener, conn),
                      method: "TLS",
                      host,
                      port: 443,
                      decision: refused.refusal.decision,
                      reason: `${refused.refusal.reason}; handshake failed: ${code}`,
                      status: 0,
                      started: Date.now(),
                      policyVersion: gate.version(),
                      mode: "close",
                      ...refused.refusal.audit,
                    }),
                  )
              : undefined,
          );
        }
        void spliceTo(raw, conn, decided, read.bytes, ctx.policy);
      },
      (e: Error & { code?: string }) => {
        log({
          event: "tls_error",
          conn: conns.of(raw)?.id ?? 0,
          listener: conn.listener,
          code: e.code ?? e.message,
        });
        raw.destroy();
      },
    );
  }

  /**
   * Resolves and checks the SNI's host as forwarding does (or checks the address the sandbox
   * dialled, `decided.dialed`), dials exactly that address, relays. `refused`: what to do when
   * that address is refused; by default the connection is terminated, where the same check
   * refuses it readably.
   */
  async function spliceTo(
    raw: Socket,
    connInfo: Omit<ConnInfo, "id" | "policyVersion">,
    decided: Extract<Decision, { kind: "forward" }>,
    hello: Buffer,
    policy: PolicyState,
    refused?: (refusal: Refusal) => void,
  ): Promise<void> {
    const started = Date.now();
    const version = policy.kind === "ready" ? policy.policy.version : null;
    // Counted like any connection: policyChanged() and close() end it; the listener caps it.
    const conn = conns.of(raw) ?? conns.track(raw, connInfo.listener, connInfo);
    conn.policyVersion = version;
    const { target } = decided;
    const finish = (decision: DecisionRecord["decision"], reason: string, extra: Partial<RecordInput> = {}) =>
      gate.emit(
        record({
          conn,
          method: "TLS",
          host: target.host,
          port: target.port,
          decision,
          reason,
          status: 0,
          started,
          policyVersion: version,
          mode: "splice",
          ...extra,
        }),
      );
    const resolved = await destination(
      gate.upstream,
      target,
      decided.via,
      decided.blockedAddress,
      decided.dialed,
    );
    if (raw.destroyed) return;
    if (!resolved.ok) {
      // DNS failure, a private or reserved address: nothing dialled. Terminated instead, where
      // the same check refuses it readably (403 / 502) and the audit records it.
      if (refused) return refused(resolved.refusal);
      raw.unshift(hello);
      return terminateTls(raw, connInfo);
    }
    const tunnelled = decided.via === "tunnel";
    let upstream: Socket | Duplex;
    try {
      upstream = tunnelled
        ? await gate.upstream.dialTunnelRaw(resolved.address, resolved.port)
        : await gate.upstream.dialRaw(resolved.address, resolved.port);
    } catch (e) {
      if (e instanceof TunnelError && !raw.destroyed) {
        // The user's agent refused the host (its own block, a private address) or the tunnel
        // went down: nothing was sent to the client yet, so terminate instead, where the same
        // refusal through the tunnel pool is answered readably and recorded.
        raw.unshift(hello);
        return terminateTls(raw, connInfo);
      }
      raw.destroy();
      return finish(
        "error",
        `upstream failed: ${(e as Error & { code?: string }).code ?? (e as Error).name}`,
        {
          bytesIn: hello.length,
        },
      );
    }
    if (raw.destroyed) {
      upstream.destroy();
      return;
    }
    const result = await relay(raw, upstream, hello, limits.spliceIdleTimeoutMs);
    finish("allow", result.error === null ? "spliced" : `spliced, ended: ${result.error}`, {
      bytesIn: result.bytesIn,
      bytesOut: result.bytesOut,
      route: tunnelled ? "tunnel" : "direct",
    });
  }

  /**
   * A TLS connection the sandbox dialled by address, DNAT'd here (default routing, I4), decided on
   * its ClientHello's SNI and on the dialled address (decideDialed). Relayed untouched to that
   * address when the host is allowed without a rule; otherwise terminated as if it had come
   * through the hosts file: a blocked host gets its readable 403 (and is recorded even when the
   * client's handshake fails), a rule host its credential. Without a usable name it is decided on
   * the address alone and, unless relayed, closed: there is no name to present a certificate for.
   * Not a ClientHello, or an encrypted one (ECH): terminated, as under catch-all.
   */
  function acceptDirectTls(raw: Socket): void {
    const dialed = deps.originalDst?.(raw) ?? null;
    if (dialed === null) {
      notDialed(raw, "direct-tls");
      return;
    }
    const conn = { listener: "direct-tls" as const, dialed };
    const started = Date.now();
    readClientHello(raw, limits.handshakeTimeoutMs).then(
      (read) => {
        if (read.parse.status !== "done" || read.parse.ech) {
          raw.unshift(read.bytes);
          return terminateTls(raw, conn);
        }
        const ctx = gate.context();
        const named = helloTarget(read.parse.sni, conn);
        const target = { host: named ?? dialed.address, port: 443, scheme: "https", path: "/" } as const;
        const { host, decided } = decideDialed(target, dialed, ctx);
        const closed = (refusal: Refusal, detail = "") => {
          gate.emit(
            record({
              conn: conns.of(raw) ?? conns.track(raw, conn.listener, conn),
              method: "TLS",
              host,
              port: 443,
              decision: refusal.decision,
              reason: `${refusal.reason}${detail}`,
              status: 0,
              started,
              policyVersion: gate.version(),
              mode: "close",
              ...refusal.audit,
            }),
          );
          raw.destroy();
        };
        if (decided.kind === "forward" && decided.dialed && deps.splice) {
          return void spliceTo(
            raw,
            conn,
            decided,
            read.bytes,
            ctx.policy,
            named === null ? closed : undefined,
          );
        }
        if (named === null) {
          return closed(
            decided.kind === "refuse"
              ? decided.refusal
              : new Refusal(403, "refuse", "no SNI: only an allowed address can be relayed", ""),
          );
        }
        raw.unshift(read.bytes);
        terminateTls(
          raw,
          conn,
          decided.kind === "refuse"
            ? (code) => closed(decided.refusal, `; handshake failed: ${code}`)
            : undefined,
        );
      },
      (e: Error & { code?: string }) => {
        log({ event: "tls_error", conn: 0, listener: conn.listener, code: e.code ?? e.message });
        raw.destroy();
      },
    );
  }

  return { acceptTls, acceptDirectTls, terminateTls };
}

/** The code a `tls_error` line carries for a name outside the run CA's constraints. */
export const OUTSIDE_RUN_CA = "outside_run_ca_names";

function outsideRunCa(host: string): Error {
  return Object.assign(new Error("the run CA's name constraints do not cover this name"), {
    code: OUTSIDE_RUN_CA,
    host,
  });
}
