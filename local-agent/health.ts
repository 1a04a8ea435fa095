import { accessSync, constants, existsSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import type { AgentHealth } from "@benchwright/shared/contract/local-agent";
import { run, SAFE_PATH } from "./command";

// What this machine can and cannot do, in plain words. Anything here makes every create call
// answer `cannot_isolate`: a sandbox is made fully isolated or not at all.

const BINARIES = ["ip", "unshare", "nsenter", "setpriv", "mount", "umount", "pivot_root", "sh"];
/** An unprivileged uid for the user-namespace probe (nobody). */
const PROBE_UID = "65534";

function onPath(name: string): boolean {
  return SAFE_PATH.split(":").some((dir) => {
    try {
      accessSync(join(dir, name), constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

const firstLine = (text: string) => text.trim().split("\n")[0] ?? "";

function readNumber(path: string): number | null {
  try {
    return Number(readFileSync(path, "utf8").trim());
  } catch {
    return null;
  }
}

/**
 * Does `path`'s own mode give others `bits`? For what is bind-mounted into a sandbox: the mount
 * makes the path's ancestors irrelevant (a checkout in a 0700 `mktemp -d` works).
 */
function modeAllows(path: string, bits: number): boolean {
  try {
    return (statSync(path).mode & bits) === bits;
  } catch {
    return false;
  }
}

export async function checkHealth(options: { nft: string; imageDir: string }): Promise<AgentHealth> {
  if (process.platform !== "linux") {
    return {
      ok: false,
      problems: [`not Linux (this is ${process.platform}): sandboxes are Linux namespaces`],
      workImageId: null,
    };
  }
  const problems: string[] = [];
  if (process.getuid?.() !== 0) problems.push(`not running as root (uid ${process.getuid?.()})`);
  const missing = BINARIES.filter((b) => !onPath(b));
  for (const b of missing) problems.push(`no \`${b}\` on PATH (${SAFE_PATH})`);

  if (readNumber("/proc/sys/user/max_user_namespaces") === 0) {
    problems.push("user namespaces are disabled (/proc/sys/user/max_user_namespaces is 0)");
  } else if (readNumber("/proc/sys/kernel/unprivileged_userns_clone") === 0) {
    problems.push("unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone is 0)");
  } else if (problems.length === 0) {
    // The real thing, as a sandbox's init does it: an unprivileged uid makes a user namespace.
    const probe = await run([
      "setpriv",
      `--reuid=${PROBE_UID}`,
      `--regid=${PROBE_UID}`,
      "--clear-groups",
      "unshare",
      "--user",
      "--map-root-user",
      "true",
    ]);
    if (probe.code !== 0) {
      problems.push(
        `an unprivileged uid cannot make a user namespace (${firstLine(probe.stderr) || `exit ${probe.code}`})`,
      );
    }
  }

  const nft = await run([options.nft, "-c", "-f", "-"], {
    input:
      "table inet bw_health {\n  chain c {\n    type filter hook input priority 0; policy accept;\n  }\n}\n",
  });
  if (nft.code === null && nft.stderr.includes("ENOENT")) {
    problems.push(`no \`${options.nft}\` (nftables) on PATH (${SAFE_PATH})`);
  } else if (nft.code !== 0) {
    problems.push(
      `nftables is unusable (\`${options.nft} -c\`: ${firstLine(nft.stderr) || `exit ${nft.code}`})`,
    );
  }

  // The proxy runs as a sandbox uid on this node, bind-mounted into the sandbox (NODE_MOUNT).
  if (!modeAllows(process.execPath, 0o005)) {
    problems.push(`node (${process.execPath}) cannot be run by other users, so not by a sandbox uid`);
  }
  // The image directory is mounted into every sandbox; its programs must be there and readable.
  for (const program of ["proxy.cjs", "wiring.cjs", "unpack.cjs", "collect.cjs"]) {
    const path = join(options.imageDir, program);
    if (!existsSync(path)) {
      problems.push(`${path} is missing (build it with \`npm run build:proxy\`)`);
    } else if (!modeAllows(path, 0o004) || !modeAllows(options.imageDir, 0o005)) {
      problems.push(`${path} is not readable by other users, so not by a sandbox uid`);
    }
  }
  return { ok: problems.length === 0, problems, workImageId: null };
}
