import type { RoutingMode } from "@benchwright/shared/contract/policy";
import { AgentError, message } from "./errors";
import {
  applyNft,
  createRunNetwork,
  createWorkNetwork,
  destroyRunNetwork,
  destroyWorkNetwork,
  hostNameservers,
  hostService,
  installHost,
  killNetnsProcesses,
  linkExists,
  MAX_RUNS,
  netnsExists,
  proxyNamespaces,
  proxyRuleset,
  type RunNet,
  readIpForward,
  removeHost,
  runNet,
  type WorkNet,
} from "./network";
import type { RegistryOptions } from "./registry-options";
import { type HostListener, startProbe, startRelay } from "./relay";

// The runs this agent holds sandboxes of, and their networks (network.ts makes the links): a
// run's number on this machine, its proxy namespace with the control-plane relay and the probe
// listener on the host side, its work links and the one ruleset over them, and the host table
// every run needs. Making and destroying a sandbox both bring these up and take them down.

export interface Listener {
  listener: HostListener;
  address: string;
}

export interface Run {
  runId: string;
  net: RunNet;
  proxyId: string | null;
  networkUp: boolean;
  relay: Listener | null;
  probe: Listener | null;
  members: Set<string>;
  /** Work index i -> the work/task sandbox on that link. */
  slots: Map<number, { id: string; routing: RoutingMode }>;
}

export class Runs {
  private readonly runs = new Map<string, Run>();
  private ipForwardBefore: string | null = null;

  constructor(private readonly o: RegistryOptions) {}

  get(runId: string): Run | undefined {
    return this.runs.get(runId);
  }

  /** The run `runId`; a new one takes the first run number no run (of any agent) uses. */
  for(runId: string): Run {
    const known = this.runs.get(runId);
    if (known) return known;
    const taken = new Set([...this.runs.values()].map((r) => r.net.k));
    for (let k = 1; k <= MAX_RUNS; k++) {
      const net = runNet(k);
      if (taken.has(k) || netnsExists(net.proxyNetns) || linkExists(net.hostLink)) continue;
      const run: Run = {
        runId,
        net,
        proxyId: null,
        networkUp: false,
        relay: null,
        probe: null,
        members: new Set(),
        slots: new Map(),
      };
      this.runs.set(runId, run);
      return run;
    }
    throw new AgentError("sandbox_failed", `this machine already has ${MAX_RUNS} runs`);
  }

  releaseIfEmpty(run: Run): void {
    if (run.members.size === 0 && run.proxyId === null && run.slots.size === 0) this.runs.delete(run.runId);
  }

  private async ensureHost(): Promise<void> {
    if (this.ipForwardBefore !== null) return;
    const before = readIpForward();
    this.o.state.recordHost(before);
    await installHost(this.o.nft);
    this.ipForwardBefore = before;
  }

  /**
   * The run's proxy namespace and its link to the host, with the relay to the control plane and
   * the probe listener on the host side; returns the relay. On a failure the caller dismantles
   * what was made (dismantleRunNetwork).
   */
  async openRunNetwork(run: Run): Promise<HostListener> {
    await this.ensureHost();
    this.o.state.recordNetns(run.net.proxyNetns);
    run.networkUp = true;
    await createRunNetwork(this.o.nft, run.net);
    const cp = this.o.controlPlane;
    const relay = await startRelay({
      host: run.net.hostAddress,
      allowFrom: run.net.upAddress,
      target: {
        host: cp.hostname.replace(/^\[(.*)\]$/, "$1"),
        port: Number(cp.port || (cp.protocol === "https:" ? 443 : 80)),
      },
    });
    run.relay = { listener: relay, address: run.net.hostAddress };
    run.probe = { listener: await startProbe(run.net.probeAddress), address: run.net.probeAddress };
    await hostService(this.o.nft, run.net.hostLink, this.hostServices(run), true);
    return relay;
  }

  /**
   * A work link of the run (its slot already taken) and the run's ruleset with it; on a failure
   * the caller dismantles it (dismantleWorkNetwork).
   */
  async openWorkLink(run: Run, net: WorkNet): Promise<void> {
    this.o.state.recordNetns(net.netns);
    await createWorkNetwork(net, run.net.proxyNetns);
    try {
      await this.applyRunRules(run);
    } catch (error) {
      throw new Error(`could not install the redirect: ${message(error)}`);
    }
  }

  private hostServices(run: Run): Array<{ address: string; port: number }> {
    return [run.relay, run.probe].flatMap((l) => (l ? [{ address: l.address, port: l.listener.port }] : []));
  }

  private applyRunRules(run: Run): Promise<string> {
    const links = [...run.slots].map(([i, s]) => ({ i, routing: s.routing }));
    return applyNft(
      this.o.nft,
      run.net.proxyNetns,
      proxyRuleset(run.net.k, links, { allowCidrs: this.o.directAllowCidrs, nameservers: hostNameservers() }),
    );
  }

  async dismantleWorkNetwork(run: Run, net: WorkNet): Promise<void> {
    await killNetnsProcesses(net.netns);
    await destroyWorkNetwork(net, run.net.proxyNetns);
    this.o.state.forgetNetns(net.netns);
    // The link is gone, so its rules match nothing; still, keep the ruleset exact.
    if (run.networkUp) await this.applyRunRules(run).catch(() => {});
  }

  async dismantleRunNetwork(run: Run): Promise<void> {
    const services = this.hostServices(run);
    if (services.length > 0) await hostService(this.o.nft, run.net.hostLink, services, false);
    for (const l of [run.relay, run.probe]) await l?.listener.close();
    run.relay = null;
    run.probe = null;
    if (!run.networkUp) return;
    await killNetnsProcesses(run.net.proxyNetns);
    await destroyRunNetwork(run.net);
    this.o.state.forgetNetns(run.net.proxyNetns);
    run.networkUp = false;
  }

  /** The host table removed, once this agent's runs are gone, unless another agent's still need it. */
  async removeHostIfUnused(): Promise<void> {
    if (this.ipForwardBefore !== null && proxyNamespaces().length === 0) {
      await removeHost(this.o.nft, this.ipForwardBefore);
      this.o.state.forgetHost();
      this.ipForwardBefore = null;
    }
  }
}
