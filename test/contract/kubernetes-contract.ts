// What the Kubernetes contract server (kubernetes-server.ts, Node) tells the workerd tests, what
// it recorded, and the knobs a test may turn. Types only, so both the Node global setup and the
// workerd tests import it.

export interface KubernetesContractInfo {
  /** http://127.0.0.1:<port>: the API server's origin (SANDBOX0_API_URL). */
  url: string;
  /** The one bearer token it accepts (SANDBOX0_TOKEN). */
  token: string;
}

/** One API request as the contract server saw it. The Authorization header is kept as an outcome only. */
export interface RecordedRequest {
  seq: number;
  method: string;
  path: string;
  query: Record<string, string[]>;
  contentType: string | null;
  /** The parsed JSON body (null when none). */
  body: unknown;
  auth: "ok" | "missing" | "invalid";
  status: number;
  /** pods/exec only: what went over the WebSocket. */
  exec?: {
    protocol: string | null;
    command: string[];
    container: string | null;
    /** What came on stdin as UTF-8, its first 64 KiB. */
    stdin: string;
    stdinBytes: number;
    closedStdin: boolean;
    exitCode: number | null;
  };
}

/** Per-namespace behaviour of the contract server (POST /_contract/options). */
export interface ContractOptions {
  namespace: string;
  /** The exec subprotocols it speaks, best first (default v5 then v4). */
  execProtocols?: string[];
  /** A new pod stays Pending for this many reads before it runs (default 0). */
  pendingReads?: number;
  /** An init container of every new pod exits with this code (the pod then fails). */
  initFailure?: { container: string; exitCode: number; message: string };
  /** PodSecurity admission level enforced on the namespace (default privileged). */
  podSecurity?: "privileged" | "baseline";
  /** Whether pods/resize exists (default true; false: 404 as on a cluster before 1.33). */
  resize?: boolean;
  /**
   * The setup container keeps running after `bw-init seal` (as if setup's root had stopped the
   * sealer from ending it): the backend must then refuse to go on.
   */
  setupSurvivesSeal?: boolean;
}

declare module "vitest" {
  export interface ProvidedContext {
    kubernetes: KubernetesContractInfo;
  }
}
