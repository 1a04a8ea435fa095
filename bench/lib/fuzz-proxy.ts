// The fuzz bench's proxy side, in its own process: the real proxy with its two upstreams, started
// by the same code as case F3's test (test/proxy/fuzz-lib.ts, on test/proxy/harness.ts), so that
// a crash is a process that died, and the proxy has a core of its own beside the load generator.
// Forked by bench/fuzz-bench.ts with an IPC channel:
//   child  → { kind: "ready", httpPort, tlsPort, caPem }
//   parent → { kind: "drain", id }
//   child  → { kind: "drained", id, plain, tls, decisions, rssMiB }
// `plain` and `tls` are the requests each upstream received since the last drain (taken out, so
// memory stays flat over 100,000 cases); `decisions` tallies the proxy's decision records.
import { startFuzzProxy } from "../../test/proxy/fuzz-lib";

async function main(): Promise<void> {
  const fuzz = await startFuzzProxy();
  // The bench going away takes the proxy with it (closed, so its scratch directory goes too).
  process.once("disconnect", () => {
    const bound = setTimeout(() => process.exit(0), 3_000);
    void fuzz.close().finally(() => {
      clearTimeout(bound);
      process.exit(0);
    });
  });
  const decisions: Record<string, number> = {};
  process.on("message", (m: { kind: string; id: number }) => {
    if (m.kind !== "drain") return;
    for (const r of fuzz.proxy.logs.splice(0)) {
      const key = r.event === "decision" ? `${r.decision}` : String(r.event ?? "other");
      decisions[key] = (decisions[key] ?? 0) + 1;
    }
    // The audit recorder keeps every row; only the bench's memory would notice.
    const a = fuzz.proxy.audit;
    for (const rows of [a.blocked, a.agentBlocked, a.routes, a.modelCalls]) rows.length = 0;
    process.send?.({
      kind: "drained",
      id: m.id,
      plain: fuzz.plainUp.seen.splice(0),
      tls: fuzz.tlsUp.seen.splice(0),
      decisions,
      rssMiB: process.memoryUsage().rss / 2 ** 20,
    });
  });
  process.send?.({
    kind: "ready",
    httpPort: fuzz.proxy.httpPort,
    tlsPort: fuzz.proxy.tlsPort,
    caPem: fuzz.proxy.caPem,
  });
}

main().catch((e: unknown) => {
  console.error(`fuzz proxy failed to start: ${(e as Error).stack ?? e}`);
  process.exit(1);
});
