import { describe, expect, it } from "vitest";
import {
  migrateState,
  newState,
  STATE_VERSION,
  type StoredState,
  type Worker,
} from "../../src/coordinator/state";
import { worker } from "../../src/coordinator/steps/common";

// The coordinator's stored state is versioned (src/coordinator/state.ts): a state stored before
// versions, or by an older one (every run in flight at a deploy), is read as this version's when
// its object loads it.

describe("coordinator state: one migration on load", () => {
  it("fills an unversioned state's later fields, renames its spec's old keys, keeps the rest", () => {
    const stored: StoredState = {
      runId: "run_1",
      state: "running",
      attempt: 0,
      faults: 1,
      enteredAt: 5,
      cancel: false,
      final: null,
      spec: { commands: ["true"], egress: "direct", on_proxy_failure: "continue" },
      policy: {
        version: 3,
        routing: { mode: "default", reasons: [] },
        enforce: true,
        hostsFile: ["api.example"],
        note: null,
      },
      network: { sandboxId: "sbx_p", created: true },
      proxy: { launches: 1, execId: "proxy-1", caCertPem: "CA", unfiltered: false },
      workers: [
        // Wired before the setup stage existed: at its commands.
        {
          sandboxId: "sbx_w",
          kind: "work",
          taskIndex: null,
          name: "work",
          commands: ["true"],
          proxyAddress: "10.0.0.1",
          probeTarget: null,
          wiringExecId: "wiring",
          env: { A: "1" },
          cmdIndex: 0,
          execId: null,
          stdoutFrom: 0,
          stderrFrom: 0,
          exitCode: null,
          done: false,
        },
        // Not made yet: no stage.
        {
          sandboxId: "sbx_t",
          kind: "task",
          taskIndex: 0,
          name: "t",
          commands: ["true"],
          proxyAddress: null,
          probeTarget: null,
          wiringExecId: null,
          env: null,
          cmdIndex: 0,
          execId: null,
          stdoutFrom: 0,
          stderrFrom: 0,
          exitCode: null,
          done: false,
          routing: "catch-all",
        },
      ],
      traceBytes: 12,
      halted: true,
    };
    const s = migrateState(stored);
    expect(s).toMatchObject({
      version: STATE_VERSION,
      faults: 1,
      cancelReason: null,
      spec: { onProxyFailure: "continue" },
      policy: { version: 3, model: null, placeholders: [] },
      placeholderNonce: null,
      tunnel: null,
      proxy: { execId: "proxy-1", checkedAt: null, outEnd: 0, errEnd: 0 },
      traceBytes: 12,
      outputEvents: 0,
      halted: true,
      halts: 0,
      linger: null,
      hostsCheckedAt: null,
      hostsEdits: 0,
      routingNoted: false,
    });
    expect(s?.workers.map((w) => [w.sandboxId, w.stage, w.setup, w.environment, w.routing, w.image])).toEqual(
      [
        ["sbx_w", "execute", [], false, undefined, null],
        ["sbx_t", null, [], false, "catch-all", null],
      ],
    );
  });

  it("gives a version 2 state's workers no setup image, and keeps everything else", () => {
    const current = newState("run_3", 9);
    current.state = "running";
    current.workers = [
      worker("sbx_w", "work", null, "work", ["true"], ["pip install x"]),
      worker("sbx_t", "task", 0, "t", ["true"], ["pip install x"]),
    ];
    current.workers[0] = {
      ...(current.workers[0] as Worker),
      stage: "setup",
      setupIndex: 1,
      env: { A: "1" },
    };
    // As version 2 stored it: no `image` on its workers.
    const stored: StoredState = {
      ...current,
      version: 2,
      workers: current.workers.map(({ image: _, ...w }) => w),
    };
    const s = migrateState(stored);
    expect(s?.version).toBe(STATE_VERSION);
    expect(s?.workers.map((w) => w.image)).toEqual([null, null]);
    expect(s).toEqual({ ...current, version: STATE_VERSION, placeholderNonce: null });
  });

  it("gives a version 3 state no placeholders: no nonce, none in its policy (case N1)", async () => {
    const current = newState("run_4", 9);
    expect(current.placeholderNonce).toMatch(/^[a-z0-9]{20}$/);
    current.state = "running";
    current.policy = {
      version: 3,
      routing: { mode: "default", reasons: [] },
      enforce: true,
      hostsFile: ["api.example"],
      note: null,
      model: null,
      placeholders: [{ env: "API_TOKEN", secret: "API_TOKEN" }],
    };
    // As version 3 stored it: its proxy was launched without a nonce, so it swaps nothing.
    const { placeholderNonce: _, ...rest } = current;
    const { placeholders: __, ...policy } = current.policy;
    const stored: StoredState = { ...rest, version: 3, policy };
    const s = migrateState(stored);
    expect(STATE_VERSION).toBe(4);
    expect(s).toEqual({ ...current, placeholderNonce: null, policy: { ...policy, placeholders: [] } });
  });

  it("leaves a state of this version as it is, and no state as none", () => {
    const s = newState("run_2", 7);
    expect(migrateState(s)).toBe(s);
    expect(migrateState(undefined)).toBeUndefined();
  });
});
