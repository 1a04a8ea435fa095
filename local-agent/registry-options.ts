import type { AgentHealth } from "@benchwright/shared/contract/local-agent";
import type { LogRecord } from "@benchwright/shared/contract/log";
import type { CgroupHost } from "./cgroups";
import type { LayerStore } from "./layers";
import type { StateDir } from "./state-dir";

// What the agent gives its registry of sandboxes (sandboxes.ts), read by each of its parts: the
// runs' networks (runs.ts), making (sandbox-create.ts), execs (exec-start.ts) and destroying
// (sandbox-destroy.ts). Apart so that those parts need not import the registry that uses them.

export type AgentLog = (event: LogRecord) => void;

export interface RegistryOptions {
  nft: string;
  state: StateDir;
  controlPlane: URL;
  /** First host uid of sandboxes; each sandbox takes two (setup U, execute U+1). */
  uidBase: number;
  health: AgentHealth;
  log: AgentLog;
  /** Host directory with the image's programs (mounted read-only in every sandbox). */
  imageDir: string;
  /** The work image's exported files (rootfs.ts): every sandbox's overlay's lower layer. */
  rootfs: string | null;
  /** The setup layers this agent keeps (layers.ts). */
  layers: LayerStore;
  /** Where sandboxes' cgroups are made (cgroups.ts). */
  cgroups: CgroupHost | null;
  /** Private CIDRs default-routing sandboxes may reach directly (development and tests only). */
  directAllowCidrs: readonly string[];
  /**
   * Test-only settings added to the proxy's environment (BW_TEST_*): the suite's own upstream CA
   * and routes. Never set outside development and tests.
   */
  proxyTestEnv: Record<string, string>;
}
