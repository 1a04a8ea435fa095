import { levelOf, logLine } from "@benchwright/shared/contract/log";
import { describe, expect, it } from "vitest";

// Every log line of the Worker, the proxy and the agents (shared/contract/log.ts): level and
// timestamp first, the event's own fields unchanged, one table of which events are above info.

describe("log lines", () => {
  it("put level and ts first and keep the record's fields as they were", () => {
    const at = new Date("2026-12-02T06:00:00.123Z");
    const line = logLine("warn", { event: "tunnel_down", runId: "run_1", nested: { a: 1 } }, at);
    expect(line).toBe(
      '{"level":"warn","ts":"2026-12-02T06:00:00.123Z","event":"tunnel_down","runId":"run_1","nested":{"a":1}}',
    );
  });

  it("keep a record's own level", () => {
    const record = JSON.parse(logLine("info", { level: "error", event: "audit_batch_rejected" }));
    expect(record).toMatchObject({ level: "error", event: "audit_batch_rejected" });
    expect(typeof record.ts).toBe("string");
  });

  it("level events from one table: failures warn or error, decisions and refusals info", () => {
    expect(levelOf({ event: "decision" })).toBe("info");
    expect(levelOf({ event: "refused" })).toBe("info");
    expect(levelOf({ event: "tunnel_down" })).toBe("warn");
    expect(levelOf({ event: "tls_error" })).toBe("warn");
    expect(levelOf({ event: "sandbox_failed" })).toBe("error");
    expect(levelOf({ event: "tunnel_refused" })).toBe("error");
    expect(levelOf({ event: "model_lane", problem: "upstream failed" })).toBe("warn");
    expect(levelOf({ event: "model_lane", model: "m" })).toBe("info");
    expect(levelOf({ level: "error", event: "decision" })).toBe("error");
    expect(levelOf({})).toBe("info");
  });
});
