import type { Resources, Seal } from "@benchwright/shared/contract/local-agent";
import type { WiringReinstall } from "@benchwright/shared/contract/wiring";

// What the e2b backend runs in a work sandbox for the two stages (docs/e2b.md, *Setup and
// execute*), as argument lists for the exec runner: bundles in (bw-unpack), results out
// (bw-collect), the wiring written again (bw-wiring reinstall), and the check of a run's
// resources against the template's size. Pure: the contract tests compare these exactly.

/**
 * The execute user's transfer directory, relative to its home (envd's files API resolves a
 * relative path there, and the commands below find it as $HOME): bundles are written here by the
 * files API and unpacked from here; bw-collect's archive is left here and read back.
 */
export const TRANSFER_DIR = ".bw-transfer";

/** The execute stage's user in the work template (E2B's default user). */
export const EXECUTE_USER = "user";

// $1 dir, $2 max bytes, $3 max files, $4 the archive (relative to $HOME). The archive is removed
// whatever happened; bw-unpack's exit code is the answer (0 unpacked, 2 refused, 1 failed).
const UNPACK_SCRIPT =
  'f="$HOME/$4"; if mkdir -p -- "$1"; then bw-unpack "$1" --max-bytes "$2" --max-files "$3" < "$f"; s=$?; else s=1; fi; rm -f -- "$f"; exit $s';

// $1 dir, $2 max bytes, $3 max files, $4 the archive's name. An earlier archive is removed first,
// so a sandbox keeps at most one.
const COLLECT_SCRIPT =
  'd="$HOME/.bw-transfer"; mkdir -p -- "$d" && rm -f -- "$d"/collect-*.tar.gz && exec bw-collect "$1" --max-bytes "$2" --max-files "$3" > "$d/$4"';

export const unpackArgv = (dir: string, file: string, bounds: { maxBytes: number; maxFiles: number }) => [
  "sh",
  "-c",
  UNPACK_SCRIPT,
  "bw-unpack",
  dir,
  String(bounds.maxBytes),
  String(bounds.maxFiles),
  file,
];

export const collectArgv = (dir: string, name: string, bounds: { maxBytes: number; maxFiles: number }) => [
  "sh",
  "-c",
  COLLECT_SCRIPT,
  "bw-collect",
  dir,
  String(bounds.maxBytes),
  String(bounds.maxFiles),
  name,
];

/**
 * The wiring's files for `bw-wiring reinstall`, in the places the wiring program writes them by
 * default (SandboxInfo.wiring is null on e2b): the hosts block to the bridge's local end, and
 * at seal the run CA; `caCertPem` null (setHosts) leaves the CA files alone.
 */
export function reinstallInput(
  seal: Pick<Seal, "routing" | "hostsFile"> & { caCertPem: string | null },
  proxyAddress: string,
): WiringReinstall {
  return {
    mode: seal.routing,
    proxyAddress,
    hostsFile: seal.routing === "default" ? seal.hostsFile : [],
    caCertPem: seal.caCertPem,
  };
}

/**
 * Why a run's resources do not fit the template E2B made the sandbox from, or null when they do.
 * E2B sizes a sandbox by its template (CPU and memory fixed at template build); a run may ask for
 * less (it gets the template's), never for more.
 */
export function resourcesMisfit(
  resources: Resources,
  size: { cpuCount: number; memoryMB: number },
  template: string,
): string | null {
  const over: string[] = [];
  if (resources.cpus > size.cpuCount) over.push(`${resources.cpus} CPUs (it has ${size.cpuCount})`);
  if (resources.memoryMb > size.memoryMB)
    over.push(`${resources.memoryMb} MB of memory (it has ${size.memoryMB})`);
  if (over.length === 0) return null;
  return `the run asks for ${over.join(" and ")}, more than the E2B template ${template} gives; build a larger template (scripts/lib/e2b-templates.ts) or ask for less`;
}
