import { message } from "./errors";
import { CA_BUNDLE, CA_DIR, CGROUP_JOIN, IMAGE_MOUNT, NODE_MOUNT, type SandboxProcess } from "./sandbox";
import { readInTree } from "./wiring-files";

// The re-proof's clean root (docs/local-backend.md, "The re-proof's clean root"). After the seal the wiring
// program proves the redirect again from the execute stage; run inside the sandbox it would load
// with the sandbox's own loader, libc and /etc/ld.so.preload, which the setup stage owned and
// could have made lie. So it runs here instead, made from the host side:
//
//   nsenter --net (the sandbox's network namespace: its routes and the host's nftables rules)
//   unshare --mount --pid --ipc --uts (host root's own, fresh: nothing of the sandbox's)
//
// in a root that is a tmpfs holding, read-only, only what the setup stage could never touch: the
// host's loader and libraries, the agent's node, the image's programs, setpriv and umount; and the files the
// seal owns, as the sandbox sees them: the bind sources of /etc/hosts, /etc/resolv.conf, the CA
// bundle and /run/benchwright (the same inodes), and a copy of the sandbox's /etc/nsswitch.conf
// (written into its tree by the seal, read here without following a link). No /etc/ld.so.preload,
// /etc/gai.conf, /etc/host.conf or anything else of the sandbox's writable layer. The program runs
// as the execute stage's host uid, no capabilities, no new privileges, in the exec's cgroup leaf.

/** The sandbox's nsswitch.conf copied into the clean root: at most this much of it. */
const MAX_NSSWITCH_BYTES = 64 * 1024;

/** Host library directories the loader searches (the same names as links where they are links). */
const LIB_DIRS = "lib lib32 lib64 libx32 usr/lib usr/lib32 usr/lib64 usr/libx32";

// Host root, in the new namespaces, on the host's files: builds the root on the sandbox's `mnt`
// directory (a mount point of this namespace only), pivots into it, detaches the host's tree and
// drops to the execute uid (after pivot_root, programs are the new root's: the host's umount and
// setpriv are bound into it). The sandbox's nsswitch.conf arrives on fd 3; `why` is set when the
// agent could not read it, and nothing is built.
const SCRIPT = `set -e
dir=$1 node=$2 image=$3 uid=$4 why=$5
shift 5
if [ -n "$why" ]; then printf 'bw-wiring: no clean root for the re-proof: %s\\n' "$why" >&2; exit 1; fi
setpriv=$(command -v setpriv) umount=$(command -v umount)
r="$dir/mnt"
mount -t tmpfs -o mode=755,nosuid,nodev,size=1m bw-clean-root "$r"
ro() {
  mount --bind "$1" "$2"
  mount -o remount,bind,ro,nosuid,nodev "$2"
}
for l in ${LIB_DIRS}; do
  mkdir -p "$r/$(dirname "$l")"
  if [ -L "/$l" ]; then ln -s "$(readlink "/$l")" "$r/$l"
  elif [ -d "/$l" ]; then mkdir "$r/$l"; ro "/$l" "$r/$l"; fi
done
mkdir -p "$r/etc/ssl/certs" "$r${IMAGE_MOUNT}" "$r${CA_DIR}" "$r/proc" "$r/dev"
for f in ${NODE_MOUNT} /run/bw-setpriv /run/bw-umount /etc/hosts /etc/resolv.conf ${CA_BUNDLE} /etc/nsswitch.conf; do
  : > "$r$f"
done
ro "$node" "$r${NODE_MOUNT}"
ro "$setpriv" "$r/run/bw-setpriv"
ro "$umount" "$r/run/bw-umount"
ro "$image" "$r${IMAGE_MOUNT}"
ro "$dir/hosts" "$r/etc/hosts"
ro "$dir/resolv.conf" "$r/etc/resolv.conf"
ro "$dir/ca-certificates.crt" "$r${CA_BUNDLE}"
ro "$dir/ca" "$r${CA_DIR}"
cat <&3 > "$r/etc/nsswitch.conf"
exec 3<&-
for n in null zero random urandom; do
  : > "$r/dev/$n"
  mount --bind "/dev/$n" "$r/dev/$n"
  mount -o remount,bind,nosuid,noexec "$r/dev/$n"
done
mount -t proc -o nosuid,nodev,noexec bw-proc "$r/proc"
mount -o remount,ro,nosuid,nodev "$r"
cd "$r"
pivot_root . .
/run/bw-umount -l .
cd /
export HOME=/
exec /run/bw-setpriv --reuid="$uid" --regid="$uid" --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@"
`;

/**
 * The command line (and its fd 3) that runs `argv` (paths as the sandbox sees them: NODE_MOUNT,
 * IMAGE_MOUNT) in the clean root beside sandbox `proc`, in its cgroup leaf `leaf`. The caller's
 * environment is not passed: the program sees HOME and the agent's PATH only.
 */
export function cleanRootCommand(
  proc: SandboxProcess,
  leaf: string,
  imageDir: string,
  argv: readonly string[],
): { argv: string[]; fd3: string } {
  let nsswitch = "";
  let why = "";
  try {
    nsswitch = readInTree(proc.rootPath, "etc/nsswitch.conf", MAX_NSSWITCH_BYTES);
  } catch (error) {
    why = `the sandbox's ${message(error)}`;
  }
  return {
    argv: [
      "sh",
      "-c",
      CGROUP_JOIN,
      "bw-cgroup",
      ...proc.cgroup.procsFiles(leaf),
      "--",
      "nsenter",
      "-t",
      String(proc.initPid),
      "--net",
      "--",
      "unshare",
      "--mount",
      "--pid",
      "--ipc",
      "--uts",
      "--fork",
      "--kill-child",
      "--propagation",
      "private",
      "sh",
      "-c",
      SCRIPT,
      "bw-clean-root",
      proc.dir,
      process.execPath,
      imageDir,
      String(proc.uid + 1),
      why,
      ...argv,
    ],
    fd3: nsswitch,
  };
}
