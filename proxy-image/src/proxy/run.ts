// Starting the proxy: configuration → audit reporter → policy client (first read) → run CA (name-
// constrained by that read under default routing, N5) → listeners (and the catch-all resolver when
// BW_DNS_PORT is set, and the view on 127.0.0.1:BW_VIEW_PORT) → tell the control plane we are
// ready (CA certificate for the work sandbox to trust).

import type { AddressInfo, Server } from "node:net";
import { join } from "node:path";
import { type Evented, logLine as formatLine, levelOf } from "@benchwright/shared/contract/log";
import { usesTunnel } from "@benchwright/shared/contract/policy-routing";
import { bearer, ProxyReady, readyPath } from "@benchwright/shared/contract/proxy-wire";
import { createAddressPolicy } from "@benchwright/shared/node/address-policy";
import { AuditReporter } from "./audit";
import { createRunCa } from "./ca";
import { computeLane } from "./compute-lane";
import { loadProxyConfig } from "./config";
import { type CatchAllResolver, startCatchAllResolver } from "./dns";
import { type AuditSink, createProxy } from "./handler";
import { isoNow, logLines } from "./log-lines";
import { modelLane } from "./model/lane";
import { terminableNames } from "./name-constraints";
import { loadOriginalDst } from "./original-dst";
import { type LogFn, PolicyClient } from "./policy-client";
import { TunnelClient } from "./tunnel-client";
import { createUpstream } from "./upstream";
import { isDecision, View } from "./view";

function listen(server: Server, port: number, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve((server.address() as AddressInfo).port));
  });
}

export async function runProxy(env: NodeJS.ProcessEnv, argv: string[]) {
  const config = loadProxyConfig(env, argv);
  let proxy: ReturnType<typeof createProxy> | null = null;
  // Every JSON line on stdout goes through one batch, so they keep their order (log-lines.ts).
  const lines = logLines();
  // Each with its level (by event) and a timestamp first, then the record as it was.
  const logLine = <R extends Evented>(record: R) =>
    lines.write(formatLine(levelOf(record), record, isoNow()));
  // The policy client and the audit reporters say their own level; their lines join the same
  // stream, named by component, so an operator reads one log in order.
  const clientLog =
    (component: string, source?: string): LogFn =>
    (level, event, fields) =>
      lines.write(
        formatLine(level, { event, component, ...(source ? { source } : {}), ...fields }, isoNow()),
      );
  // The egress tunnel is dialled once the policy routes anything through the user's machine
  // (egress local, or a host via tunnel), and then kept: a later edit may route through it again.
  const tunnel = new TunnelClient({
    controlPlaneUrl: config.BW_CONTROL_PLANE_URL,
    runId: config.BW_RUN_ID,
    proxyToken: config.BW_PROXY_TOKEN,
    log: logLine,
  });
  const startTunnelIfRouted = () => {
    const state = policy.current();
    if (state.kind !== "ready") return;
    if (usesTunnel(state.policy.routing)) tunnel.start();
  };
  const policy = new PolicyClient({
    controlPlaneUrl: config.BW_CONTROL_PLANE_URL,
    runId: config.BW_RUN_ID,
    proxyToken: config.BW_PROXY_TOKEN,
    intervalMs: config.BW_POLICY_INTERVAL_MS,
    log: clientLog("policy-client"),
    onChange: () => {
      startTunnelIfRouted();
      void proxy?.policyChanged();
    },
  });
  const audit = new AuditReporter({
    controlPlaneUrl: config.BW_CONTROL_PLANE_URL,
    runId: config.BW_RUN_ID,
    proxyToken: config.BW_PROXY_TOKEN,
    auditKey: config.BW_AUDIT_KEY,
    spoolDir: config.BW_SPOOL_DIR,
    maxSpoolBytes: config.BW_SPOOL_MAX_BYTES,
    source: "proxy",
    log: clientLog("audit"),
  });
  // What the user's egress agent refused, reported through the tunnel: its own batches (source
  // local_agent), with their own spool (a subdirectory the proxy's spool never reads as a batch).
  const agentAudit = new AuditReporter({
    controlPlaneUrl: config.BW_CONTROL_PLANE_URL,
    runId: config.BW_RUN_ID,
    proxyToken: config.BW_PROXY_TOKEN,
    auditKey: config.BW_AUDIT_KEY,
    spoolDir: join(config.BW_SPOOL_DIR, "local-agent"),
    maxSpoolBytes: config.BW_SPOOL_MAX_BYTES,
    source: "local_agent",
    log: clientLog("audit", "local_agent"),
  });
  const sink: AuditSink = {
    recordBlocked: (host, source = "proxy") => (source === "proxy" ? audit : agentAudit).recordBlocked(host),
    recordRoute: (host, route) => audit.recordRoute(host, route),
    recordStrayPlaceholder: (host, secret) => audit.recordStrayPlaceholder(host, secret),
    recordModelCall: (row) => void audit.recordModelCall(row),
    recordLimitRefusal: (host, method, limit) => void audit.recordLimitRefusal(host, method, limit),
    get accepting() {
      return audit.accepting && agentAudit.accepting;
    },
  };
  const upstream = createUpstream({
    addressPolicy: createAddressPolicy({
      ownAddresses: config.ownAddresses,
      allowCidrs: config.testAllowCidrs,
    }),
    extraCaPem: config.extraCaPem,
    testRoutes: config.testRoutes,
    tunnel,
  });
  await audit.start();
  await agentAudit.start();
  // The CA is made from the first policy read: under default routing it vouches only for the
  // names the proxy may terminate then (name-constraints.ts).
  const ca = await createRunCa({
    runId: config.BW_RUN_ID,
    permittedNames: terminableNames(await policy.start()),
  });
  const view = new View({ runId: config.BW_RUN_ID, policy, audit });
  proxy = createProxy({
    ca,
    policy,
    audit: sink,
    upstream,
    computeLane: computeLane(config.BW_CONTROL_PLANE_URL),
    splice: config.BW_SPLICE === "on",
    originalDst: await loadOriginalDst(),
    placeholderNonce: config.BW_PLACEHOLDER_NONCE,
    modelLane: modelLane({ upstream, log: logLine }),
    // Each record goes to stdout as one JSON line, as always, and the decisions to the view too.
    log: (record) => {
      logLine(record);
      if (isDecision(record)) view.record(record);
    },
  });
  startTunnelIfRouted();
  const host = config.BW_LISTEN_HOST;
  const listeners = {
    tls: await listen(proxy.tls, config.BW_TLS_PORT, host),
    http: await listen(proxy.http, config.BW_HTTP_PORT, host),
    explicit: await listen(proxy.explicit, config.BW_EXPLICIT_PORT, host),
  };
  // Not in the ready call's listeners (the control plane needs none of them): in the ready line.
  const direct = {
    tls:
      config.BW_DIRECT_TLS_PORT === undefined
        ? null
        : await listen(proxy.directTls, config.BW_DIRECT_TLS_PORT, host),
    http:
      config.BW_DIRECT_HTTP_PORT === undefined
        ? null
        : await listen(proxy.directHttp, config.BW_DIRECT_HTTP_PORT, host),
  };
  const dns: CatchAllResolver | null =
    config.BW_DNS_PORT === undefined
      ? null
      : await startCatchAllResolver({ host, port: config.BW_DNS_PORT, answer: config.BW_DNS_ANSWER });
  const viewAddress = await view.listen(config.BW_VIEW_PORT);
  const state = policy.current();
  const ready = ProxyReady.parse({
    caCertPem: ca.certPem,
    caFingerprint256: ca.fingerprint256,
    policyVersion: state.kind === "ready" ? state.policy.version : null,
    listeners,
  });
  const res = await fetch(new URL(readyPath(config.BW_RUN_ID), config.BW_CONTROL_PLANE_URL), {
    method: "POST",
    headers: { authorization: bearer(config.BW_PROXY_TOKEN), "content-type": "application/json" },
    body: JSON.stringify(ready),
    redirect: "error",
  });
  if (!res.ok) throw new Error(`control plane refused the ready call: HTTP ${res.status}`);
  logLine({
    event: "ready",
    runId: config.BW_RUN_ID,
    listeners,
    direct,
    dns: dns?.port ?? null,
    view: viewAddress.port,
    ca: ca.fingerprint256,
  });
  // Whoever started the proxy waits for this line: it must not sit in the batch.
  lines.flush();

  const shutdown = async () => {
    await proxy?.close();
    await tunnel.stop();
    await dns?.close();
    await view.close();
    await policy.stop();
    await audit.stop();
    await agentAudit.stop();
    lines.close();
  };
  return {
    ca,
    listeners,
    direct,
    dns,
    policy,
    audit,
    proxy,
    view: { address: viewAddress.address, port: viewAddress.port },
    shutdown,
  };
}
