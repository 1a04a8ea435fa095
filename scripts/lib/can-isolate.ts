import { accessSync, constants } from "node:fs";

// Whether this machine can make sandboxes of the local backend (and the suite's and demo's own
// upstream namespaces): Linux, root, and the tools the host agent drives. The agent's health
// check says the same in more detail; this is the quick answer before starting anything.

const PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

export function onPath(name: string): boolean {
  return PATH.split(":").some((dir) => {
    try {
      accessSync(`${dir}/${name}`, constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

/** Why this machine cannot run the suite, or null. */
export function whyNotRunnable(): string | null {
  if (process.platform !== "linux") return "not Linux";
  if (process.getuid?.() !== 0) return "not root";
  const missing = ["ip", "nft", "unshare", "nsenter", "setpriv"].filter((b) => !onPath(b));
  return missing.length > 0 ? `missing ${missing.join(", ")}` : null;
}
