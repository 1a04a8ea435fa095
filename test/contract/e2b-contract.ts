// What the E2B contract server (e2b-server.ts, Node) tells the workerd tests, what it recorded,
// and the faults a test can ask of it. Types only, so both the Node global setup and the workerd
// tests import it.

export interface E2bContractInfo {
  /** http://127.0.0.1:<port>: both the platform API (apiUrl) and envd (sandboxUrl). */
  url: string;
  /** The only API key the contract server accepts (X-API-KEY). */
  apiKey: string;
  /** The sandbox domain it pretends to serve (what getHost() names). */
  domain: string;
  /** Template names it starts with (built, ready); others exist once built through its API. */
  templates: { proxy: string; work: string };
  /**
   * Whether each sandbox's setup cgroup is a real cgroup v2 on this machine (bw-exec seal then
   * kills through it, for real); false where this machine has none to give.
   */
  cgroups: boolean;
}

/**
 * One request as the contract server saw it. The three credential headers (X-API-KEY,
 * X-Access-Token, e2b-traffic-access-token) are not kept, only whether each was right; every
 * other header and the whole body are kept, so tests can search them.
 */
export interface RecordedE2bRequest {
  seq: number;
  /**
   * platform: the REST API; envd: the sandbox's process and files API (Connect and HTTP); storage: a
   * template build's file upload (the pre-signed URL E2B hands out; its body is not kept).
   */
  api: "platform" | "envd" | "storage" | "contract";
  method: string;
  path: string;
  query: Record<string, string>;
  /** The E2B sandbox the request was about (path or E2b-Sandbox-Id), if any. */
  sandboxId: string | null;
  /** envd: the user the request runs as (its Basic authorization), null when none was given. */
  user: string | null;
  apiKey: "ok" | "wrong" | "absent";
  accessToken: "ok" | "wrong" | "absent";
  headers: Record<string, string>;
  /**
   * The JSON body (a streaming envd request: its one enveloped message); an envd file upload or
   * a storage upload: `{ bytes }`, its size only.
   */
  body: unknown;
  status: number;
  /**
   * The deployment (metadata `bw-deployment`) of the sandbox the request made or was about, or
   * that a list asked for; null when none (a template build). Test files that run at once tell
   * their requests apart by it.
   */
  deployment: string | null;
}

/** A sandbox as the contract server holds it. */
export interface ContractSandbox {
  sandboxID: string;
  /** E2B's id of the template (create names it by name; E2B answers with the id and `alias`). */
  templateID: string;
  alias: string;
  state: "running" | "paused";
  metadata: Record<string, string>;
  envVars: Record<string, string>;
  network: Record<string, unknown> | null;
  autoPause: boolean;
  timeoutSeconds: number;
  pauses: number;
  resumes: number;
  /**
   * GET /_contract/sandboxes only: this machine's directory that is the sandbox's home, for every
   * user (the server's filesystem model).
   */
  home?: string;
}

/**
 * Faults for the sandboxes of one run (metadata `bw-run`): what a misbehaving E2B deployment or a
 * badly built template would do.
 */
export interface E2bFaults {
  runId: string;
  /** The work template's bw-check-user fails (its execute user still has sudo). */
  checkUserFails?: boolean;
  /** The work template's bw-redirect fails (no iptables). */
  redirectFails?: boolean;
  /** Create answers 201 but keeps no allowOut/denyOut (a deployment that ignores them). */
  dropNetworkOnCreate?: boolean;
  /** A resumed sandbox comes back without its allowOut/denyOut. */
  dropNetworkOnResume?: boolean;
  /** PUT .../network answers 204 and changes nothing. */
  ignoreNetworkUpdates?: boolean;
}

/** A template build as the contract server holds it (GET /_contract/templates). */
export interface ContractTemplateBuild {
  templateID: string;
  buildID: string;
  name: string;
  tags: string[];
  cpuCount: number;
  memoryMB: number;
  status: "waiting" | "building" | "ready" | "error";
  /** The start request (TemplateBuildStartV2) as received; null until the build is started. */
  start: {
    fromImage?: string;
    /** The registry credentials of a private fromImage (the SDK's `fromImage(image, {username, password})`). */
    fromImageRegistry?: { type: string; username?: string; password?: string };
    fromTemplate?: string;
    startCmd?: string;
    readyCmd?: string;
    force?: boolean;
    steps: Array<{ type: string; args?: string[]; filesHash?: string; force?: boolean }>;
  } | null;
  reason: { message: string; step?: string } | null;
}

/** One uploaded layer archive (a COPY step's files), keyed by the SDK's files hash. */
export interface ContractLayerFiles {
  hash: string;
  /** What the archive holds, as tar entries: path, type, mode bits, size, SHA-256 of the content. */
  entries: Array<{
    path: string;
    type: "file" | "directory" | "symlink";
    mode: number;
    size: number;
    sha256: string;
  }>;
  /**
   * The COPY step that used it and whether the server, recomputing the SDK's files hash from the
   * archive and that step's source and destination, got the same hash (null: not recomputable,
   * a directory's size is not in a tar; absent: no step used it yet).
   */
  copy?: { src: string; dest: string; verified: boolean | null };
}

/** A template build that fails: its first RUN step whose command contains `runContaining`. */
export interface E2bBuildFault {
  template: string;
  runContaining: string;
  exitCode?: number;
}

declare module "vitest" {
  export interface ProvidedContext {
    e2b: E2bContractInfo;
  }
}
