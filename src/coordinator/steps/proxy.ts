import type { Machine } from "../ports";
import { type MachineState, newProxy } from "../state";
import { cannotIsolate, checkpoint, lastLine, move, must, NO_SANDBOX_CODES, POLL_MS, stop } from "./common";

// starting_proxy: the run's proxy sandbox is made and the proxy launched in it with fresh
// credentials, until it reports ready (its CA); while running, its liveness is checked.

export const PROXY_READY_DEADLINE_MS = 30_000;
/** How often a running (or halted) run checks that its proxy is still there. */
export const PROXY_CHECK_MS = 2_000;

/** Proxy listener ports inside the proxy sandbox (see the local-agent contract). */
// The catch-all resolver always listens: a task sandbox made after a vault edit may need
// catch-all routing even when the run started under default routing.
export const PROXY_ENV = {
  BW_LISTEN_HOST: "0.0.0.0",
  BW_TLS_PORT: "8443",
  BW_HTTP_PORT: "8080",
  BW_EXPLICIT_PORT: "3128",
  BW_DNS_PORT: "5353",
  // Connections a default-routing sandbox dials by address (the local backend DNATs them, I4).
  BW_DIRECT_TLS_PORT: "8444",
  BW_DIRECT_HTTP_PORT: "8081",
  BW_SPOOL_DIR: "/tmp/benchwright-spool",
};

export async function startProxy(m: Machine, s: MachineState): Promise<number> {
  const policy = must(s.policy);
  if (!s.network) {
    s.network = { sandboxId: m.ports.newId("sbx_"), created: false };
    await checkpoint(m, s);
  }
  if (!s.network.created) {
    const made = await m.ports.broker.create(s.runId, { id: s.network.sandboxId, kind: "proxy" });
    if (!made.ok) {
      if (made.retryable) throw new Error(made.message);
      if (NO_SANDBOX_CODES.has(made.code)) return cannotIsolate(m, s, made.code, made.message);
      return proxyFailed(m, s, new Error(made.message));
    }
    s.network.created = true;
  }
  if (!policy.enforce) {
    await move(m, s, "starting_sandboxes", "no_proxy_needed");
    return m.ports.now();
  }
  if (!s.proxy) {
    s.proxy = newProxy();
  }
  if (s.proxy.execId === null) {
    // A launch that may have started before a crash holds credentials we are about to
    // replace: stop it first, then launch under a new exec id with fresh credentials.
    if (s.proxy.launches > 0) {
      await m.ports.broker.kill(s.runId, s.network.sandboxId, `proxy-${s.proxy.launches}`);
    }
    s.proxy.launches += 1;
    await checkpoint(m, s);
    const { proxyToken, auditKey } = await m.ports.issueProxyCredentials(s.runId);
    const info = await m.ports.broker.exec(s.runId, s.network.sandboxId, {
      id: `proxy-${s.proxy.launches}`,
      argv: ["bw-proxy"],
      env: {
        ...PROXY_ENV,
        BW_RUN_ID: s.runId,
        BW_PROXY_TOKEN: proxyToken,
        BW_AUDIT_KEY: auditKey,
        // The run's own (state.ts): a relaunch swaps the placeholders the sandboxes already hold.
        ...(s.placeholderNonce ? { BW_PLACEHOLDER_NONCE: s.placeholderNonce } : {}),
      },
      stage: "setup",
      timeoutMs: null,
    });
    s.proxy.execId = info.execId;
    return m.ports.now() + POLL_MS;
  }
  const ready = await m.ports.proxyReady(s.runId);
  if (ready) {
    s.proxy.caCertPem = ready.caCertPem;
    await move(m, s, "starting_sandboxes", "proxy_ready");
    return m.ports.now();
  }
  const exec = await m.ports.broker.poll(s.runId, s.network.sandboxId, s.proxy.execId, {
    stdoutFrom: 0,
    stderrFrom: 0,
  });
  if (exec.state === "exited") {
    const last = lastLine(exec.stderr) || lastLine(exec.stdout) || `exit code ${exec.exitCode}`;
    return proxyFailed(m, s, new Error(`the proxy exited during setup: ${last}`));
  }
  if (m.ports.now() - s.enteredAt > PROXY_READY_DEADLINE_MS) {
    return proxyFailed(
      m,
      s,
      new Error(`the proxy did not report ready within ${PROXY_READY_DEADLINE_MS / 1000} s`),
    );
  }
  return m.ports.now() + POLL_MS;
}

/**
 * The proxy is the run's only way out and the keeper of its credentials: if it dies mid-run
 * (crash, OOM kill, a kill from outside), nothing the commands do reaches an upstream, and a
 * run that went on would fail in ways nobody could read. Stop it, tear everything down, and
 * say why. Checked every PROXY_CHECK_MS through the broker (every backend reports its execs);
 * only the output since the last check is read. Null while the proxy runs.
 */
export async function checkProxy(m: Machine, s: MachineState): Promise<number | null> {
  const p = s.proxy;
  if (!p || p.unfiltered || p.execId === null || !s.network) return null;
  const now = m.ports.now();
  if (p.checkedAt !== null && now - p.checkedAt < PROXY_CHECK_MS) return null;
  p.checkedAt = now;
  const exec = await m.ports.broker.poll(s.runId, s.network.sandboxId, p.execId, {
    stdoutFrom: p.outEnd,
    stderrFrom: p.errEnd,
  });
  p.outEnd = exec.stdoutEnd;
  p.errEnd = exec.stderrEnd;
  if (exec.state === "running") return null;
  const how = exec.signal ? `killed by ${exec.signal}` : `exit code ${exec.exitCode}`;
  const last = lastLine(exec.stderr) || lastLine(exec.stdout);
  const why = `the proxy stopped mid-run (${how}${last ? `: ${last}` : ""})`;
  await m.ports.note(s.runId, {
    level: "warning",
    code: "proxy_lost",
    text: `The run's proxy stopped while the run was going (${how}). Nothing could leave through it from then on, so the run was stopped: its commands were ended and its sandboxes removed.`,
  });
  return stop(m, s, "proxy_lost", `${why}; the commands were ended and the sandboxes removed`);
}

async function proxyFailed(m: Machine, s: MachineState, error: unknown): Promise<number> {
  const why = error instanceof Error ? error.message : String(error);
  const policy = must(s.policy);
  const mayContinue =
    s.spec?.onProxyFailure === "continue" && policy.routing.mode === "default" && s.network?.created === true;
  if (mayContinue) {
    // A proxy that failed its setup may still run, holding the run's credentials and a copy of
    // the vault: stop it and revoke them, so no boundary that is not enforced keeps them.
    const network = must(s.network);
    if (s.proxy && s.proxy.launches > 0) {
      await m.ports.broker.kill(s.runId, network.sandboxId, `proxy-${s.proxy.launches}`);
    }
    await m.ports.revokeProxyCredentials(s.runId);
    await m.ports.note(s.runId, {
      level: "warning",
      code: "proxy_failed_unfiltered",
      text: `The proxy could not be set up (${why}). The run was launched with onProxyFailure "continue", so it goes on and its traffic leaves UNFILTERED: no credential is injected and no host is blocked.`,
    });
    s.proxy = {
      ...newProxy(),
      launches: s.proxy?.launches ?? 0,
      execId: s.proxy?.execId ?? null,
      unfiltered: true,
    };
    await move(m, s, "starting_sandboxes", "proxy_failed_continue");
    return m.ports.now();
  }
  await m.ports.note(s.runId, {
    level: "warning",
    code: "proxy_failed",
    text: `The proxy could not be set up (${why}), so the run stopped before any benchmark code ran.`,
  });
  return stop(m, s, "proxy_setup_failed", why);
}
