import type { RoutingMode } from "../contract/policy";
import { PLATFORM_HOSTS } from "../contract/proxy-wire";

// The wiring's hosts-file redirect and the CA bundle check, as one pure module: the wiring program
// writes the block from inside a sandbox (bw-wiring), the local host agent rewrites it from
// outside (seal, a vault edit under default routing), and both must give the same file.

export const HOSTS_BLOCK_BEGIN = "# BEGIN benchwright wiring (rewritten by each wiring run; do not edit)";
export const HOSTS_BLOCK_END = "# END benchwright wiring";

/** The names the block sends to the proxy: the policy's exact names (default routing) and the platform's. */
export function wiredHosts(mode: RoutingMode, hostsFile: readonly string[]): string[] {
  return mode === "default" ? [...new Set([...hostsFile, ...PLATFORM_HOSTS])] : [...PLATFORM_HOSTS];
}

/** The block's lines: `<proxyAddress> <host>`. */
export function hostsEntries(proxyAddress: string, hosts: readonly string[]): string[] {
  return hosts.map((h) => `${proxyAddress} ${h}`);
}

const canonical = (name: string) => name.toLowerCase().replace(/\.$/, "");

/**
 * The hosts file with the wiring's block (re)written at its end: every other line kept as it is
 * (localhost and friends), except that names the block owns are taken out of other lines, since
 * a resolver reading the file takes the first line that names a host.
 */
export function rewriteHosts(existing: string, entries: readonly string[], owned: readonly string[]): string {
  const names = new Set(owned);
  const out: string[] = [];
  let inBlock = false;
  const lines = existing.split("\n");
  if (lines.at(-1) === "") lines.pop();
  for (const line of lines) {
    if (line.trim() === HOSTS_BLOCK_BEGIN) {
      inBlock = true;
      continue;
    }
    if (line.trim() === HOSTS_BLOCK_END) {
      inBlock = false;
      continue;
    }
    if (inBlock) continue;
    const content = line.replace(/#.*$/, "").trim();
    const [address, ...aliases] = content === "" ? [] : content.split(/\s+/);
    if (address === undefined || !aliases.some((a) => names.has(canonical(a)))) {
      out.push(line);
      continue;
    }
    const kept = aliases.filter((a) => !names.has(canonical(a)));
    if (kept.length > 0) out.push(`${address}\t${kept.join(" ")}`);
  }
  return `${[...out, HOSTS_BLOCK_BEGIN, ...entries, HOSTS_BLOCK_END].join("\n")}\n`;
}

/** The hosts file `existing` with the redirect a sandbox under `mode` gets to `proxyAddress`. */
export function renderHostsFile(
  existing: string,
  mode: RoutingMode,
  proxyAddress: string,
  hostsFile: readonly string[],
): string {
  const hosts = wiredHosts(mode, hostsFile);
  return rewriteHosts(existing, hostsEntries(proxyAddress, hosts), hosts);
}

/** The first address a hosts file's text gives `host`, as the files resolver would. */
export function lookupInHostsText(text: string, host: string): string | null {
  for (const line of text.split("\n")) {
    const [address, ...aliases] = line.replace(/#.*$/, "").trim().split(/\s+/);
    if (address && aliases.some((a) => canonical(a) === host)) return address;
  }
  return null;
}

/** Whether `bundle` already holds the certificate in `pem` (compared on the base64 body). */
export function bundleHas(bundle: string, pem: string): boolean {
  const body = /-----BEGIN CERTIFICATE-----([\s\S]*?)-----END CERTIFICATE-----/.exec(pem)?.[1];
  if (!body) return false;
  const squeeze = (s: string) => s.replace(/\s+/g, "");
  // A PEM body starts on a base64 quantum boundary, so its squeezed form is found as-is.
  return squeeze(bundle).includes(squeeze(`-----BEGIN CERTIFICATE-----${body}-----END CERTIFICATE-----`));
}

/** `bundle` with `pem` appended unless it already holds it. */
export function withCertificate(bundle: string, pem: string): string {
  const cert = pem.endsWith("\n") ? pem : `${pem}\n`;
  if (bundleHas(bundle, cert)) return bundle;
  return `${bundle}${bundle === "" || bundle.endsWith("\n") ? "" : "\n"}${cert}`;
}

const HOSTS_LINE = /^\s*hosts\s*:/i;
const FILES_DNS = /^\s*hosts\s*:\s*files\s+dns\s*$/;

/**
 * nsswitch.conf with one hosts line, `files dns`: the hosts file first, as the wiring needs. Any
 * later hosts line goes (a resolver could read that one instead); every other database's is kept.
 */
export function filesFirst(nsswitch: string): string {
  const out: string[] = [];
  let placed = false;
  for (const line of nsswitch.split("\n")) {
    if (!HOSTS_LINE.test(line)) out.push(line);
    else if (!placed) {
      out.push(FILES_DNS.test(line) ? line : "hosts:          files dns");
      placed = true;
    }
  }
  if (out.at(-1) === "") out.pop();
  if (!placed) out.push("hosts:          files dns");
  return `${out.join("\n")}\n`;
}
