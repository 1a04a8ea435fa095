import { existsSync, readdirSync, readFileSync, readlinkSync, writeFileSync } from "node:fs";
import { PROXY_PORTS } from "@benchwright/shared/contract/local-agent";
import type { RoutingMode } from "@benchwright/shared/contract/policy";
import { NON_PUBLIC_V4 } from "@benchwright/shared/policy/addresses";
import { must, run } from "./command";

// The network of a run (docs/local-backend.md): per run k a proxy namespace bw<k>p linked to the
// host (bwh<k> 10.231.<k>.1/30 <-> up0 10.231.<k>.2/30), per work/task sandbox i a namespace
// bw<k>w<i> linked to the proxy namespace (bwp<k>w<i> 10.232.<k>.<4i+1>/30 <-> eth0 .<4i+2>/30).
// Rulesets are generated whole, as text, and applied atomically with `nft -f -`.

export const MAX_RUNS = 250;
export const MAX_WORK_PER_RUN = 64;
export const HOST_TABLE = "benchwright_host";
/** Names of the namespaces this agent makes (the test suite's own are named otherwise). */
export const NETNS_NAME = /^bw\d+(?:p|w\d+)$/;

export interface RunNet {
  k: number;
  proxyNetns: string;
  hostLink: string;
  /** Host side of the run's link: the control-plane relay listens here. */
  hostAddress: string;
  /** The proxy namespace's address on up0. */
  upAddress: string;
  /** Host address (on the run's link) where the run's probe listener answers: "outside the run". */
  probeAddress: string;
}

export function runNet(k: number): RunNet {
  return {
    k,
    proxyNetns: `bw${k}p`,
    hostLink: `bwh${k}`,
    hostAddress: `10.231.${k}.1`,
    upAddress: `10.231.${k}.2`,
    probeAddress: `10.233.${k}.1`,
  };
}

export interface WorkNet {
  k: number;
  i: number;
  netns: string;
  /** The link's name in the proxy namespace. */
  proxyLink: string;
  proxyAddress: string;
  address: string;
}

export function workNet(k: number, i: number): WorkNet {
  return {
    k,
    i,
    netns: `bw${k}w${i}`,
    proxyLink: `bwp${k}w${i}`,
    proxyAddress: `10.232.${k}.${4 * i + 1}`,
    address: `10.232.${k}.${4 * i + 2}`,
  };
}

const REJECT = "reject with icmpx type admin-prohibited";

/**
 * Destinations direct traffic (default routing) never reaches: the host's side of every run,
 * every other run, and the platform's table of non-public ranges (private, shared, loopback,
 * link-local and cloud metadata, multicast, reserved), so a sandbox cannot probe the machine's
 * own network.
 */
const PRIVATE_V4 = NON_PUBLIC_V4.map((r) => r.cidr);

export interface DirectExceptions {
  /** Private CIDRs direct traffic may reach anyway (development and tests: their own upstreams). */
  allowCidrs: readonly string[];
  /** The resolvers of default-routing sandboxes (port 53 only), often on the local network. */
  nameservers: readonly string[];
}

/**
 * The proxy namespace's table. A work link not listed here is refused everything but the
 * proxy's ports, so a link exists closed before its rules do.
 */
export function proxyRuleset(
  k: number,
  links: ReadonlyArray<{ i: number; routing: RoutingMode }>,
  except: DirectExceptions = { allowCidrs: [], nameservers: [] },
): string {
  const { tls, http, explicit, dns, directTls, directHttp } = PROXY_PORTS;
  const nat: string[] = [];
  const direct: string[] = [];
  for (const { i, routing } of [...links].sort((a, b) => a.i - b.i)) {
    const w = workNet(k, i);
    const iif = `iifname "${w.proxyLink}"`;
    if (routing === "default") {
      nat.push(`${iif} ip daddr ${w.proxyAddress} tcp dport 443 dnat ip to ${w.proxyAddress}:${tls}`);
      nat.push(`${iif} ip daddr ${w.proxyAddress} tcp dport 80 dnat ip to ${w.proxyAddress}:${http}`);
      // Every other 80/443, dialled by address (its own DNS, `curl --resolve`): to the proxy's
      // direct listeners, which read the SNI / Host, decide, and relay to the address dialled
      // (I4). The first matching dnat wins, so the proxy's own address keeps the rules above.
      nat.push(`${iif} meta nfproto ipv4 tcp dport 443 dnat ip to ${w.proxyAddress}:${directTls}`);
      nat.push(`${iif} meta nfproto ipv4 tcp dport 80 dnat ip to ${w.proxyAddress}:${directHttp}`);
      direct.push(`"${w.proxyLink}"`);
    } else {
      nat.push(`${iif} meta nfproto ipv4 tcp dport 443 dnat ip to ${w.proxyAddress}:${tls}`);
      nat.push(`${iif} meta nfproto ipv4 tcp dport 80 dnat ip to ${w.proxyAddress}:${http}`);
      nat.push(
        `${iif} meta nfproto ipv4 meta l4proto { tcp, udp } th dport 53 dnat ip to ${w.proxyAddress}:${dns}`,
      );
    }
  }
  return [
    "table inet bw {",
    "}",
    "delete table inet bw",
    "table inet bw {",
    "  chain prerouting {",
    "    type nat hook prerouting priority dstnat; policy accept;",
    ...nat.map((r) => `    ${r}`),
    "  }",
    "  chain input {",
    "    type filter hook input priority filter; policy accept;",
    '    iifname != "bwp*" accept',
    "    ct state established,related accept",
    `    tcp dport { ${tls}, ${http}, ${explicit}, ${dns} } accept`,
    // The direct listeners take only what the rules above DNAT'd there (a connection made to
    // them directly has no original destination to relay to).
    `    ct status dnat tcp dport { ${directTls}, ${directHttp} } accept`,
    `    udp dport ${dns} accept`,
    `    ${REJECT}`,
    "  }",
    "  chain forward {",
    "    type filter hook forward priority filter; policy accept;",
    '    oifname "bwp*" ct state established,related accept',
    `    oifname "bwp*" ${REJECT}`,
    '    iifname != "bwp*" accept',
    // The host's side of every run, every other run, and link-local (cloud metadata endpoints).
    `    ip daddr { 10.231.0.0/16, 10.232.0.0/16, 169.254.0.0/16 } ${REJECT}`,
    ...(direct.length > 0
      ? [
          // QUIC (UDP 443) would carry a blocked host past the direct listeners: refused, so
          // clients fall back to TCP, which reaches them (I4).
          `    iifname { ${direct.join(", ")} } udp dport 443 ${REJECT}`,
          ...(except.nameservers.length > 0
            ? [
                `    iifname { ${direct.join(", ")} } oifname "up0" ip daddr { ${except.nameservers.join(", ")} } meta l4proto { tcp, udp } th dport 53 accept`,
              ]
            : []),
          // This run's probe listener (outside the run, reachable only without catch-all), and
          // the development/test upstreams the agent was told about.
          `    iifname { ${direct.join(", ")} } oifname "up0" ip daddr { ${[runNet(k).probeAddress, ...except.allowCidrs].join(", ")} } accept`,
          `    ip daddr { ${PRIVATE_V4.join(", ")} } ${REJECT}`,
          `    meta nfproto ipv4 iifname { ${direct.join(", ")} } oifname "up0" accept`,
        ]
      : []),
    `    ${REJECT}`,
    "  }",
    "  chain postrouting {",
    "    type nat hook postrouting priority srcnat; policy accept;",
    '    oifname "up0" masquerade',
    "  }",
    "}",
    "",
  ].join("\n");
}

/**
 * The host's table: masquerade the runs' traffic out of the host's own interfaces; from a run's
 * link, the host answers only that run's relay and probe listeners; nothing unsolicited is
 * forwarded into a run's link (so runs cannot reach each other through the host).
 */
export function hostRuleset(): string {
  return [
    `table inet ${HOST_TABLE} {`,
    "}",
    `delete table inet ${HOST_TABLE}`,
    `table inet ${HOST_TABLE} {`,
    "  set services {",
    "    type ifname . ipv4_addr . inet_service;",
    "  }",
    "  chain input {",
    "    type filter hook input priority filter; policy accept;",
    '    iifname != "bwh*" accept',
    "    ct state established,related accept",
    "    iifname . ip daddr . tcp dport @services accept",
    `    ${REJECT}`,
    "  }",
    "  chain forward {",
    "    type filter hook forward priority filter; policy accept;",
    '    oifname "bwh*" ct state established,related accept',
    `    oifname "bwh*" ${REJECT}`,
    "  }",
    "  chain postrouting {",
    "    type nat hook postrouting priority srcnat; policy accept;",
    '    ip saddr 10.231.0.0/16 oifname != "bw*" masquerade',
    "  }",
    "}",
    "",
  ].join("\n");
}

/** `nft -f -` in a namespace (null: the host's). */
export function applyNft(nft: string, netns: string | null, ruleset: string): Promise<string> {
  const argv = netns === null ? [nft, "-f", "-"] : ["ip", "netns", "exec", netns, nft, "-f", "-"];
  return must(argv, { input: ruleset });
}

async function sysctls(netns: string, values: Record<string, string>): Promise<void> {
  const args = Object.entries(values).flat();
  await must([
    "ip",
    "netns",
    "exec",
    netns,
    "sh",
    "-c",
    'while [ $# -gt 0 ]; do [ -e "/proc/sys/$1" ] && { echo "$2" > "/proc/sys/$1" || exit 1; }; shift 2; done',
    "sysctl",
    ...args,
  ]);
}

const ipBatch = (netns: string | null, lines: string[]) =>
  must(netns === null ? ["ip", "-batch", "-"] : ["ip", "-n", netns, "-batch", "-"], {
    input: `${lines.join("\n")}\n`,
  });

/** Deletes a namespace of ours by name (a proxy namespace with its host link). Never throws. */
export async function deleteNetns(name: string): Promise<void> {
  const proxy = /^bw(\d+)p$/.exec(name);
  if (proxy) await run(["ip", "link", "del", `bwh${proxy[1]}`]);
  await run(["ip", "netns", "del", name]);
}

/** Proxy namespaces on this machine (another agent's runs, when this agent has none). */
export function proxyNamespaces(): string[] {
  try {
    return readdirSync("/run/netns").filter((n) => /^bw\d+p$/.test(n));
  } catch {
    return [];
  }
}

export function netnsExists(name: string): boolean {
  return existsSync(`/run/netns/${name}`);
}

export function linkExists(name: string): boolean {
  return existsSync(`/sys/class/net/${name}`);
}

/** Proxy namespace, its link to the host, addresses, forwarding; rules with no work link yet. */
export async function createRunNetwork(nft: string, net: RunNet): Promise<void> {
  await ipBatch(null, [
    `netns add ${net.proxyNetns}`,
    `link add ${net.hostLink} type veth peer name up0 netns ${net.proxyNetns}`,
    `addr add ${net.hostAddress}/30 dev ${net.hostLink}`,
    `addr add ${net.probeAddress}/32 dev ${net.hostLink}`,
    `link set ${net.hostLink} up`,
  ]);
  await ipBatch(net.proxyNetns, [
    `addr add ${net.upAddress}/30 dev up0`,
    "link set lo up",
    "link set up0 up",
    `route add default via ${net.hostAddress}`,
  ]);
  await sysctls(net.proxyNetns, { "net/ipv4/ip_forward": "1" });
  await applyNft(nft, net.proxyNetns, proxyRuleset(net.k, []));
}

/** Removes the run's link first (synchronously gone), then its namespace. Never throws. */
export function destroyRunNetwork(net: RunNet): Promise<void> {
  return deleteNetns(net.proxyNetns);
}

/** The work namespace (IPv6 off before any link arrives) and its link to the proxy namespace. */
export async function createWorkNetwork(net: WorkNet, proxyNetns: string): Promise<void> {
  await must(["ip", "netns", "add", net.netns]);
  await sysctls(net.netns, {
    "net/ipv6/conf/all/disable_ipv6": "1",
    "net/ipv6/conf/default/disable_ipv6": "1",
  });
  await ipBatch(proxyNetns, [
    `link add ${net.proxyLink} type veth peer name eth0 netns ${net.netns}`,
    `addr add ${net.proxyAddress}/30 dev ${net.proxyLink}`,
    `link set ${net.proxyLink} up`,
  ]);
  await ipBatch(net.netns, [
    `addr add ${net.address}/30 dev eth0`,
    "link set lo up",
    "link set eth0 up",
    `route add default via ${net.proxyAddress}`,
  ]);
}

export async function destroyWorkNetwork(net: WorkNet, proxyNetns: string): Promise<void> {
  if (netnsExists(proxyNetns)) await run(["ip", "-n", proxyNetns, "link", "del", net.proxyLink]);
  await run(["ip", "netns", "del", net.netns]);
}

/**
 * Kills every process in `netns` (what a crashed agent left): first those inside a sandbox's
 * PID namespace, so that their host-side parents (unshare, nsenter) reap them and exit; then,
 * if any process is still there, everything.
 */
export async function killNetnsProcesses(netns: string): Promise<void> {
  const myPidNs = readlinkSync("/proc/self/ns/pid");
  for (let attempt = 0; attempt < 100; attempt++) {
    const { stdout } = await run(["ip", "netns", "pids", netns]);
    const pids = stdout.split(/\s+/).filter(Boolean).map(Number);
    if (pids.length === 0) return;
    for (const pid of pids) {
      let inSandbox = false;
      try {
        inSandbox = readlinkSync(`/proc/${pid}/ns/pid`) !== myPidNs;
      } catch {}
      if (inSandbox || attempt >= 50) {
        try {
          process.kill(pid, "SIGKILL");
        } catch {}
      }
    }
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** The host's IPv4 nameservers, minus loopback ones (a sandbox cannot reach the host's loopback). */
export function hostNameservers(): string[] {
  let text = "";
  try {
    text = readFileSync("/etc/resolv.conf", "utf8");
  } catch {}
  return [...text.matchAll(/^\s*nameserver\s+(\d+\.\d+\.\d+\.\d+)\s*$/gm)]
    .map((m) => m[1] as string)
    .filter((a) => !a.startsWith("127."));
}

const IP_FORWARD = "/proc/sys/net/ipv4/ip_forward";

export function readIpForward(): string {
  return readFileSync(IP_FORWARD, "utf8").trim();
}

/** Installs the host table and turns on forwarding. */
export async function installHost(nft: string): Promise<void> {
  await applyNft(nft, null, hostRuleset());
  writeFileSync(IP_FORWARD, "1");
}

/** Removes the host table and restores ip_forward; never throws. */
export async function removeHost(nft: string, ipForwardBefore: string | null): Promise<void> {
  await run([nft, "delete", "table", "inet", HOST_TABLE]);
  if (ipForwardBefore !== null) {
    try {
      writeFileSync(IP_FORWARD, ipForwardBefore);
    } catch {}
  }
}

/** Lets a run's link reach host listeners (its relay and probe), or no longer. */
export async function hostService(
  nft: string,
  link: string,
  services: ReadonlyArray<{ address: string; port: number }>,
  allow: boolean,
): Promise<void> {
  const elements = `{ ${services.map((s) => `"${link}" . ${s.address} . ${s.port}`).join(", ")} }`;
  if (allow) await must([nft, "add", "element", "inet", HOST_TABLE, "services", elements]);
  else await run([nft, "delete", "element", "inet", HOST_TABLE, "services", elements]);
}
