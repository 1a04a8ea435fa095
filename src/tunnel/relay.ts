import { DurableObject } from "cloudflare:workers";
import { consoleLog } from "@benchwright/shared/contract/log";
import {
  CLOSE_PEER_GONE,
  CLOSE_REPLACED,
  CLOSE_RUN_ENDED,
  CLOSE_TOKEN_REVOKED,
  PAIRED,
} from "@benchwright/shared/contract/tunnel";
import { loadConfig } from "../config";
import { openDb } from "../db/client";
import * as runsService from "../runs/service";

// The egress tunnel's relay: one Durable Object per run (named by the run id) that joins the run's
// proxy and the user's egress agent, both of which dialled in (shared/contract/tunnel.ts). It carries
// their bytes unchanged and reads none of them: inside is one HTTP/2 connection between the two
// ends, with TLS to each upstream inside that, so the relay could not see a request if it tried.
//
// The sockets are accepted with the hibernation API: an idle pair costs no duration, and the
// attachments (role, paired) survive the object being evicted between messages. Who may connect
// is decided before the upgrade reaches here (the proxy token, the run's egress token).
//
// A pair is one HTTP/2 session: when either end leaves or is replaced, the other is closed too,
// so that both start a fresh session with the next pair. While the agent is away the proxy
// refuses tunnelled egress (it never falls back to direct); the run's notes say the tunnel went
// down, and its trace has every down and up.

export type TunnelRole = "proxy" | "agent";
/** Set by the Worker route after it checked the credential; never from outside. */
export const ROLE_HEADER = "x-benchwright-tunnel-role";
export const RUN_HEADER = "x-benchwright-tunnel-run";

interface Attachment {
  role: TunnelRole;
  runId: string;
  paired: boolean;
}

export interface TunnelStatus {
  proxy: boolean;
  agent: boolean;
  paired: boolean;
}

const other = (role: TunnelRole): TunnelRole => (role === "proxy" ? "agent" : "proxy");

export class TunnelRelay extends DurableObject<Env> {
  override async fetch(request: Request): Promise<Response> {
    const role = request.headers.get(ROLE_HEADER);
    const runId = request.headers.get(RUN_HEADER);
    if ((role !== "proxy" && role !== "agent") || !runId) return new Response(null, { status: 400 });
    if (request.headers.get("upgrade")?.toLowerCase() !== "websocket") {
      return new Response(null, { status: 426, headers: { upgrade: "websocket" } });
    }
    // A newer connection of the same end takes over (an agent restarted on the user's machine,
    // a relaunched proxy): the older one is closed, and so is a peer paired with it.
    for (const old of this.ctx.getWebSockets(role)) this.closeQuietly(old, CLOSE_REPLACED, "replaced");
    for (const peer of this.ctx.getWebSockets(other(role))) {
      if (this.attachment(peer)?.paired) this.closeQuietly(peer, CLOSE_PEER_GONE, "peer replaced");
    }
    const { 0: client, 1: server } = new WebSocketPair();
    this.ctx.acceptWebSocket(server, [role]);
    server.serializeAttachment({ role, runId, paired: false } satisfies Attachment);
    await this.pairIfBoth();
    return new Response(null, { status: 101, webSocket: client });
  }

  override async webSocketMessage(ws: WebSocket, message: ArrayBuffer | string): Promise<void> {
    // Only bytes are carried; the only text message is the relay's own PAIRED.
    if (typeof message === "string") return;
    const me = this.attachment(ws);
    if (!me?.paired) return;
    for (const peer of this.ctx.getWebSockets(other(me.role))) {
      if (this.attachment(peer)?.paired) peer.send(message);
    }
  }

  override async webSocketClose(ws: WebSocket, code: number): Promise<void> {
    await this.left(ws, code);
  }

  override async webSocketError(ws: WebSocket): Promise<void> {
    await this.left(ws, 1011);
  }

  /** Both ends present, for the coordinator (waiting for the agent before any code runs). */
  async status(): Promise<TunnelStatus> {
    const live = (role: TunnelRole) => this.ctx.getWebSockets(role).filter((ws) => this.attachment(ws));
    const proxy = live("proxy");
    const agent = live("agent");
    return {
      proxy: proxy.length > 0,
      agent: agent.length > 0,
      paired: agent.some((ws) => this.attachment(ws)?.paired === true),
    };
  }

  /** The run is over: both ends are told not to come back. */
  async endRun(): Promise<void> {
    for (const ws of this.ctx.getWebSockets()) this.closeQuietly(ws, CLOSE_RUN_ENDED, "run ended");
  }

  /** The agent's token was replaced or revoked: its connection ends now. */
  async dropAgent(): Promise<void> {
    for (const ws of this.ctx.getWebSockets("agent"))
      this.closeQuietly(ws, CLOSE_TOKEN_REVOKED, "token revoked");
    for (const ws of this.ctx.getWebSockets("proxy")) {
      if (this.attachment(ws)?.paired) this.closeQuietly(ws, CLOSE_PEER_GONE, "agent gone");
    }
  }

  private attachment(ws: WebSocket): Attachment | null {
    // A closed socket keeps its attachment; one we closed ourselves is marked gone (null).
    const a = ws.deserializeAttachment() as Attachment | null;
    return a && ws.readyState === WebSocket.OPEN ? a : null;
  }

  private async pairIfBoth(): Promise<void> {
    const [proxy] = this.ctx.getWebSockets("proxy").filter((ws) => this.attachment(ws));
    const [agent] = this.ctx.getWebSockets("agent").filter((ws) => this.attachment(ws));
    if (!proxy || !agent) return;
    for (const ws of [proxy, agent]) {
      const a = this.attachment(ws) as Attachment;
      ws.serializeAttachment({ ...a, paired: true } satisfies Attachment);
      ws.send(PAIRED);
    }
    const a = this.attachment(agent) as Attachment;
    await this.record(a.runId, "up");
  }

  private async left(ws: WebSocket, code: number): Promise<void> {
    const a = ws.deserializeAttachment() as Attachment | null;
    if (!a) return;
    ws.serializeAttachment(null);
    this.closeQuietly(ws, 1000, "bye");
    if (!a.paired) return;
    for (const peer of this.ctx.getWebSockets(other(a.role))) {
      if (this.attachment(peer)?.paired) this.closeQuietly(peer, CLOSE_PEER_GONE, "peer gone");
    }
    // The run's end closes both on purpose; anything else is the tunnel going down.
    if (code !== CLOSE_RUN_ENDED) await this.record(a.runId, "down", a.role);
  }

  private closeQuietly(ws: WebSocket, code: number, reason: string): void {
    const a = ws.deserializeAttachment() as Attachment | null;
    if (a) ws.serializeAttachment(null);
    try {
      ws.close(code, reason);
    } catch {
      // Already closed or closing.
    }
  }

  /** A trace row for every up and down, and a note the first time the tunnel goes down. */
  private async record(runId: string, what: "up" | "down", gone?: TunnelRole): Promise<void> {
    const { db, close } = openDb(loadConfig(this.env));
    try {
      const at = new Date().toISOString();
      await runsService.addEvent(db, runId, `tunnel:${what}:${at}`, "note", {
        text:
          what === "up"
            ? "The egress agent is connected: tunnelled hosts go out through the user's machine."
            : `The egress tunnel went down (${gone === "agent" ? "the egress agent disconnected" : "the proxy disconnected"}); tunnelled egress is refused until it is back.`,
        at,
      });
      if (what === "down") {
        await runsService.addNote(db, runId, {
          level: "warning",
          code: "tunnel_down",
          text: "The egress tunnel went down during the run: while it was down, hosts routed through your machine were refused (never sent direct). The trace has each time it went down and came back.",
        });
      }
    } catch (error) {
      // The trace is a record, not the enforcement: the proxy refuses either way.
      consoleLog("error", { event: "tunnel_record_failed", runId, error: (error as Error).name });
    } finally {
      await close().catch(() => {});
    }
  }
}

export function relayStub(env: Env, runId: string): DurableObjectStub<TunnelRelay> {
  return env.TUNNEL_RELAY.get(env.TUNNEL_RELAY.idFromName(runId));
}
