import {
  PLACEHOLDER_PREFIX,
  PlaceholderNonce,
  placeholderValue,
} from "@benchwright/shared/contract/placeholder";
import type { RunSpec } from "@benchwright/shared/contract/run-spec";
import { compilePolicy } from "@benchwright/shared/policy/compile";
import { describe, expect, it } from "vitest";
import { type Policy, SPEC, world } from "./run-machine-world";

// Placeholders in the sandboxes' environment (case N1): the coordinator makes the run's nonce,
// gives it to the proxy, and puts each rule's placeholder (never the secret) under the rule's
// variable in every setup command's and command's environment, in work and task sandboxes.

/**
 * A compiled vault whose rules resolved their variables (as the compiler does): API_TOKEN under
 * its own name, GITHUB_PAT under a name the rule chose, HIDDEN under none, and one that asks for
 * the model lane's OPENAI_API_KEY.
 */
function placeholderPolicy(model = false): Policy {
  const doc = compilePolicy(
    {
      version: 7,
      default: "allow",
      hosts: [],
      rules: [
        { host: "api.example", secret: "API_TOKEN", inject: { scheme: "bearer", name: "authorization" } },
        { host: "github.example", secret: "GITHUB_PAT", inject: { scheme: "bearer", name: "authorization" } },
        { host: "hidden.example", secret: "HIDDEN", inject: { scheme: "raw", name: "x-key" } },
        { host: "llm.example", secret: "LLM_KEY", inject: { scheme: "bearer", name: "authorization" } },
      ],
    },
    model
      ? {
          egress: "direct",
          model: {
            name: "eval-model",
            provider: "openai",
            baseUrl: "https://api.openai.example/v1",
            upstreamModel: "gpt-x",
            secret: "MODEL_KEY",
            budget: null,
          },
        }
      : { egress: "direct" },
  );
  const chosen = ["API_TOKEN", "GH_TOKEN", null, "OPENAI_API_KEY"];
  return { ...doc, rules: doc.rules.map((r, i) => ({ ...r, placeholderEnv: chosen[i] ?? null })) };
}

const TASKS: RunSpec = {
  ...SPEC,
  setup: ["pip install thing"],
  tasks: [{ name: "t1", commands: ["echo t1"], setup: ["make t1"] }],
};

/** Every setup command and command the machine started (not the proxy, not the wiring). */
const benchmarkExecs = (w: ReturnType<typeof world>) =>
  [...w.execs.entries()].filter(([, e]) => e.argv[0] === "sh").map(([key, e]) => ({ key, ...e }));

const proxyExecs = (w: ReturnType<typeof world>) =>
  [...w.execs.values()].filter((e) => e.argv[0] === "bw-proxy");

describe("run machine: placeholders in the sandboxes' environment", () => {
  // case N1
  it("case N1: each setup command and command holds the placeholder under the secret's name or the rule's, never the secret", async () => {
    const w = world({ spec: TASKS, policy: placeholderPolicy() });
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    const nonce = end?.placeholderNonce as string;
    expect(PlaceholderNonce.safeParse(nonce).success).toBe(true);

    const execs = benchmarkExecs(w);
    // work: setup-0, cmd-0, cmd-1; t1: setup-0, setup-1, cmd-0.
    expect(execs.map((e) => e.key.split("/")[1]).sort()).toEqual(
      ["setup-0", "cmd-0", "cmd-1", "setup-0", "setup-1", "cmd-0"].sort(),
    );
    for (const e of execs) {
      expect(e.env.API_TOKEN, e.key).toBe(placeholderValue("API_TOKEN", nonce));
      expect(e.env.GH_TOKEN, e.key).toBe(`${PLACEHOLDER_PREFIX}GITHUB_PAT-${nonce}`);
      // No model declared: the rule's OPENAI_API_KEY is its placeholder.
      expect(e.env.OPENAI_API_KEY, e.key).toBe(placeholderValue("LLM_KEY", nonce));
      // A rule with no variable gives none, and no variable is the secret's under another name.
      expect(e.env.GITHUB_PAT, e.key).toBeUndefined();
      expect(e.env.HIDDEN, e.key).toBeUndefined();
      const placeholders = Object.values(e.env).filter((v) => v.startsWith(PLACEHOLDER_PREFIX));
      expect(placeholders.sort(), e.key).toEqual(
        ["API_TOKEN", "GITHUB_PAT", "LLM_KEY"].map((s) => placeholderValue(s, nonce)).sort(),
      );
      // The wiring's own variables are still there beside them.
      expect(e.env.SSL_CERT_FILE, e.key).toBe("/etc/ssl/certs/ca-certificates.crt");
    }
    // The coordinator keeps the variables' names and secrets' names, never a value.
    expect(end?.policy?.placeholders).toEqual([
      { env: "API_TOKEN", secret: "API_TOKEN" },
      { env: "GH_TOKEN", secret: "GITHUB_PAT" },
      { env: "OPENAI_API_KEY", secret: "LLM_KEY" },
    ]);
  });

  // case N1
  it("case N1: the model lane's variables win over a rule's placeholder of the same name", async () => {
    const w = world({ policy: placeholderPolicy(true) });
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    const nonce = end?.placeholderNonce as string;
    for (const e of benchmarkExecs(w)) {
      expect(e.env.OPENAI_API_KEY).toBe("bw-model-lane-placeholder");
      expect(e.env.API_TOKEN).toBe(placeholderValue("API_TOKEN", nonce));
      expect(Object.values(e.env)).not.toContain(placeholderValue("LLM_KEY", nonce));
    }
  });

  // case N1
  it("case N1: gives the proxy the run's nonce, the same one on a relaunch, and a new one per run", async () => {
    const w = world({ policy: placeholderPolicy() });
    w.crashAt(3); // the step that launches the proxy: it is launched again under proxy-2
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    const launches = proxyExecs(w);
    expect(launches).toHaveLength(2);
    for (const p of launches) expect(p.env.BW_PLACEHOLDER_NONCE).toBe(end?.placeholderNonce);
    const cmd = benchmarkExecs(w)[0];
    expect(cmd?.env.API_TOKEN).toBe(placeholderValue("API_TOKEN", end?.placeholderNonce as string));

    const other = world({ policy: placeholderPolicy(), runId: "run_2" });
    const otherEnd = await other.drive();
    expect(otherEnd?.placeholderNonce).toMatch(/^[a-z0-9]{20}$/);
    expect(otherEnd?.placeholderNonce).not.toBe(end?.placeholderNonce);
    expect(benchmarkExecs(other)[0]?.env.API_TOKEN).not.toBe(cmd?.env.API_TOKEN);
  });

  // case N1
  it("case N1: gives none when the run goes on unfiltered (no proxy to swap them)", async () => {
    const w = world({
      proxyNeverReady: true,
      spec: { ...SPEC, onProxyFailure: "continue" },
      policy: placeholderPolicy(),
    });
    expect((await w.drive(1000))?.state).toBe("finished");
    const execs = benchmarkExecs(w);
    expect(execs.length).toBe(2);
    for (const e of execs) {
      expect(Object.values(e.env).some((v) => v.startsWith(PLACEHOLDER_PREFIX))).toBe(false);
    }
  });

  // case N1
  it("case N1: a task environment's execs (the holder's) see the placeholders too", async () => {
    const w = world({ spec: { ...SPEC, commands: ["sleep"] }, policy: placeholderPolicy() });
    await w.machine.start("run_1");
    for (let i = 0; i < 50 && w.state()?.state !== "running"; i++) await w.next();
    const asked = await w.machine.addEnvironment({ name: "env-1" });
    const id = asked.ok ? asked.environment.id : "";
    for (let i = 0; i < 5 && (await w.machine.environment(id))?.view.state !== "ready"; i++) await w.next();
    const env = (await w.machine.environment(id))?.env;
    const nonce = w.state()?.placeholderNonce as string;
    expect(env?.API_TOKEN).toBe(placeholderValue("API_TOKEN", nonce));
    expect(env?.GH_TOKEN).toBe(placeholderValue("GITHUB_PAT", nonce));
    expect(env?.NODE_EXTRA_CA_CERTS).toBe("/run/benchwright/run-ca.pem");
  });
});
