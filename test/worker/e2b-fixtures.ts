import type { RoutingMode } from "@benchwright/shared/contract/policy";
import { expect, inject } from "vitest";
import type { ComputeBackend } from "../../src/broker/backend";
import { e2bFromEnv } from "../../src/broker/e2b/backend";
import { randomId } from "../../src/crypto/api-keys";
import type { ContractSandbox, E2bFaults, RecordedE2bRequest } from "../contract/e2b-contract";

// What the e2b backend's contract tests (test/worker/e2b-*.test.ts) share: the backend set up
// against the E2B CONTRACT SERVER (test/contract/e2b-server.ts), what that server recorded and
// holds, the faults a test asks of it, and the recorded bodies read field by field. Each test
// file is a deployment of its own (its PUBLIC_URL, the sandboxes' `bw-deployment`): files run at
// once, and each asserts exactly its own requests.

export const e2b = inject("e2b");
export const META = { deployment: "bw-deployment", run: "bw-run", kind: "bw-kind", sandbox: "bw-sandbox" };
export const SLOW = { timeout: 60_000 };

/**
 * One deployment of the backend against the contract server: its settings, the backend, and the
 * requests it sent. `others` are further deployments whose requests it sees too; `unowned`: also
 * the requests of no deployment (about no sandbox the server holds).
 */
export function e2bDeployment(publicUrl: string, sees: { others?: string[]; unowned?: boolean } = {}) {
  const ENV = {
    E2B_API_KEY: e2b.apiKey,
    PUBLIC_URL: publicUrl,
    E2B_PROXY_TEMPLATE: e2b.templates.proxy,
    E2B_WORK_TEMPLATE: e2b.templates.work,
    E2B_API_URL: e2b.url,
    E2B_DOMAIN: e2b.domain,
    E2B_SANDBOX_URL: e2b.url,
  };

  function backend(over: Record<string, string> = {}): ComputeBackend {
    const made = e2bFromEnv({ ...ENV, ...over });
    if (typeof made === "string") throw new Error(made);
    return made;
  }

  async function requests(since = 0): Promise<RecordedE2bRequest[]> {
    const all = (await (
      await fetch(`${e2b.url}/_contract/requests?since=${since}`)
    ).json()) as RecordedE2bRequest[];
    const ours = new Set([publicUrl, ...(sees.others ?? [])]);
    return all.filter((r) => (r.deployment === null ? sees.unowned === true : ours.has(r.deployment)));
  }
  const mark = async () => (await requests()).at(-1)?.seq ?? 0;

  return { ENV, backend, requests, mark };
}

async function heldSandboxes(): Promise<ContractSandbox[]> {
  return (await (await fetch(`${e2b.url}/_contract/sandboxes`)).json()) as ContractSandbox[];
}

export async function contractSandboxes(runId: string): Promise<ContractSandbox[]> {
  return (await heldSandboxes()).filter((s) => s.metadata[META.run] === runId);
}

/** The sandbox's home: its directory on this machine (the contract server's filesystem model). */
export async function homeOf(e2bId: string): Promise<string> {
  return (await heldSandboxes()).find((s) => s.sandboxID === e2bId)?.home as string;
}

export async function faults(f: E2bFaults): Promise<void> {
  const res = await fetch(`${e2b.url}/_contract/faults`, { method: "POST", body: JSON.stringify(f) });
  expect(res.status).toBe(204);
}

// biome-ignore lint/suspicious/noExplicitAny: recorded bodies are read field by field
type Body = any;
export const body = (r: RecordedE2bRequest | undefined): Body => r?.body;
/** The command line of an envd Start (what followed `bash -l -c`). */
export const commandOf = (r: RecordedE2bRequest) => (body(r)?.process?.args?.[2] as string | undefined) ?? "";
export const starts = (rs: RecordedE2bRequest[], e2bId: string) =>
  rs.filter((r) => r.api === "envd" && r.path === "/process.Process/Start" && r.sandboxId === e2bId);

export async function workOf(
  b: ComputeBackend,
  runId: string,
  proxyId: string,
  routing: RoutingMode,
  kind: "work" | "task" = "work",
) {
  const id = randomId("sbx_");
  const info = await b.create({
    kind,
    id,
    runId,
    proxySandboxId: proxyId,
    routing,
    hostsFile: ["api.openai.com"],
  });
  return { id, info };
}
