import type { BrokerCode } from "@benchwright/shared/contract/broker";
import { expect } from "vitest";
import { BackendError, type ComputeBackend } from "../../src/broker/backend";
import type { BrokerResult } from "../../src/broker/interface";
import { PROXY_ENV } from "../../src/coordinator/machine";
import { randomId } from "../../src/crypto/api-keys";

// What the cloud backends' contract tests share: a run's proxy sandbox made and its proxy launched
// the way the coordinator does it (steps/proxy.ts), with the credentials it would hand over.

export async function proxyOf(
  b: ComputeBackend,
  runId: string,
  creds = { token: randomId("tok_"), audit: `whsec_${randomId("k_")}` },
) {
  const proxyId = randomId("sbx_");
  const info = await b.create({ kind: "proxy", id: proxyId, runId });
  const launch = await b.exec(proxyId, {
    id: "proxy-1",
    argv: ["bw-proxy"],
    env: { ...PROXY_ENV, BW_RUN_ID: runId, BW_PROXY_TOKEN: creds.token, BW_AUDIT_KEY: creds.audit },
    stage: "setup",
    timeoutMs: null,
  });
  return { proxyId, info, launch, creds };
}

/** Awaits `p`, expecting it to fail with a BackendError of `code`; returns that error. */
export async function expectBackendError(p: Promise<unknown>, code: string): Promise<BackendError> {
  const error = await p.then(
    () => null,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(BackendError);
  expect((error as BackendError).code).toBe(code);
  return error as BackendError;
}

/** Awaits a broker answer, expecting a failure of `code` (the broker answers, it never throws). */
export async function expectBrokerFailure(
  p: Promise<BrokerResult<unknown>>,
  code: BrokerCode,
): Promise<void> {
  expect(await p).toMatchObject({ ok: false, code });
}
