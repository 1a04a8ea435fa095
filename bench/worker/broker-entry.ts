import { brokerStub, type SandboxBroker } from "../../src/broker/sandbox-broker";

// The broker bench's Worker (bench/broker-bench.ts): the Worker's own Durable Objects, and one
// loopback route that makes a broker call and says how long the stub took. `instances` picks the
// broker: `run`, the run's own (brokerStub, as the coordinator calls it since issue 24), or
// `shared`, the one instance every call of every run went to before ("broker"). Never deployed:
// `wrangler dev bench/worker/broker-entry.ts` serves it with wrangler.toml's bindings.

export { RunCoordinator, SandboxBroker, TunnelRelay } from "../../src/index";

/** The instance name every broker call used before issue 24. */
const SHARED = "broker";
const OPS = ["create", "exec", "poll", "destroyRun"] as const;
type Op = (typeof OPS)[number];

interface Call {
  instances: "run" | "shared";
  op: Op;
  runId: string;
  args: unknown[];
}

function stubFor(env: Env, call: Call): DurableObjectStub<SandboxBroker> {
  if (call.instances === "shared") return env.SANDBOX_BROKER.get(env.SANDBOX_BROKER.idFromName(SHARED));
  return brokerStub(env, call.runId);
}

export default {
  async fetch(request, env) {
    const path = new URL(request.url).pathname;
    if (path === "/bench/ready") return new Response("ready");
    if (path !== "/bench/call" || request.method !== "POST")
      return new Response("not found", { status: 404 });
    const call = (await request.json()) as Call;
    if (!OPS.includes(call.op)) return Response.json({ ok: false, error: "no such op" }, { status: 400 });
    const stub = stubFor(env, call) as unknown as Record<Op, (...args: unknown[]) => Promise<unknown>>;
    // Date.now() moves across I/O in workerd: enough for a call's milliseconds.
    const t0 = Date.now();
    try {
      const result = await stub[call.op](call.runId, ...call.args);
      return Response.json({ ok: true, result, ms: Date.now() - t0 });
    } catch (error) {
      return Response.json(
        { ok: false, error: (error as Error).message, ms: Date.now() - t0 },
        { status: 500 },
      );
    }
  },
} satisfies ExportedHandler<Env>;
