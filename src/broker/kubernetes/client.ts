import type { BrokerCode } from "@benchwright/shared/contract/broker";
import { BackendError } from "../backend";

// A small Kubernetes API client for workerd: `fetch` only (REST and, for pods/exec, an outbound
// WebSocket made by fetch with `Upgrade: websocket`). It knows the handful of endpoints the
// sandbox0 backend uses and turns every failure into a BackendError whose message never carries
// the token (nor any value the caller asks to keep out).

export interface KubeTarget {
  /** The API server's origin, e.g. https://k8s.example.com (no trailing path). */
  apiUrl: string;
  token: string;
  namespace: string;
}

/** A Kubernetes object as far as this client reads it. */
export interface KubeObject {
  metadata?: {
    name?: string;
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    deletionTimestamp?: string;
  };
  spec?: Record<string, unknown> & { clusterIP?: string };
  status?: PodStatus;
}

export interface ContainerState {
  waiting?: { reason?: string; message?: string };
  running?: { startedAt?: string };
  terminated?: { exitCode: number; signal?: number; reason?: string; message?: string };
}

export interface PodStatus {
  phase?: string;
  podIP?: string;
  message?: string;
  reason?: string;
  initContainerStatuses?: Array<{ name: string; state?: ContainerState }>;
  /** containerID: `<runtime>://<id>` (e.g. containerd://…), once the container was made. */
  containerStatuses?: Array<{ name: string; state?: ContainerState; containerID?: string }>;
}

/** A metav1.Status as the API server sends it with an error (and on the exec status channel). */
interface KubeStatus {
  status?: string;
  message?: string;
  reason?: string;
  code?: number;
  details?: { causes?: Array<{ reason?: string; message?: string }> };
}

/** What a refusal means for the caller: which code a 403 or 404 of this call is. */
export interface CallMeaning {
  /** e.g. "create the pod" (used in messages). */
  what: string;
  /** 403: by default backend_error (RBAC); isolation objects say cannot_isolate. */
  forbidden?: BrokerCode;
  /** 404 of a collection: by default not_found. */
  notFound?: BrokerCode;
}

const REST_TIMEOUT_MS = 20_000;
const EXEC_PROTOCOLS = ["v5.channel.k8s.io", "v4.channel.k8s.io"] as const;
const STDIN_FRAME = 64 * 1024;

export interface ExecResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  protocol: (typeof EXEC_PROTOCOLS)[number];
}

/** An exec's answer with stdout as bytes (a binary program's output: bw-collect's archive). */
export interface ExecBytesResult {
  exitCode: number;
  stdout: Uint8Array;
  stderr: string;
  protocol: (typeof EXEC_PROTOCOLS)[number];
}

export interface ExecOptions {
  /**
   * Text (a JSON line for the runner; on v4 it cannot be closed, so the reader must not read to
   * the end), or bytes to be read to their end (a bundle). A stream is sent only over
   * v5.channel.k8s.io, which can close stdin: offered only v4, the exec is refused (not_supported)
   * before a byte is sent, since the program would wait for an end that never comes.
   */
  stdin?: string | ReadableStream<Uint8Array>;
  timeoutMs: number;
  /** More stdout than this ends the exec as sandbox_failed (a bound on what is buffered). */
  maxStdoutBytes?: number;
}

/** What workerd's fetch gives for an upgraded response (typed here, so Node's tsc reads it too). */
interface UpgradedSocket {
  accept(): void;
  binaryType?: string;
  send(data: ArrayBuffer | ArrayBufferView | string): void;
  close(code?: number, reason?: string): void;
  addEventListener(type: "message", listener: (event: { data: unknown }) => void): void;
  addEventListener(type: "close" | "error", listener: (event: unknown) => void): void;
}

export class KubeClient {
  constructor(
    private readonly target: KubeTarget,
    /** Values that must never appear in an error message (besides the token). */
    private readonly hidden: () => string[] = () => [],
  ) {}

  get namespace(): string {
    return this.target.namespace;
  }

  /** /api/v1/namespaces/{ns}/{resource} or /apis/{group}/namespaces/{ns}/{resource}. */
  path(resource: string, name?: string, sub?: string): string {
    const group = resource === "networkpolicies" ? "/apis/networking.k8s.io/v1" : "/api/v1";
    const ns = encodeURIComponent(this.target.namespace);
    return `${group}/namespaces/${ns}/${resource}${name ? `/${encodeURIComponent(name)}` : ""}${sub ? `/${sub}` : ""}`;
  }

  private url(path: string, query?: URLSearchParams): string {
    const q = query && [...query.keys()].length > 0 ? `?${query}` : "";
    return `${this.target.apiUrl.replace(/\/+$/, "")}${path}${q}`;
  }

  /** One REST call; the parsed JSON body (or text, for logs), or a BackendError. 404 → null. */
  async call(
    method: string,
    path: string,
    meaning: CallMeaning,
    options: { body?: unknown; contentType?: string; query?: URLSearchParams; text?: boolean } = {},
  ): Promise<{ status: number; body: unknown } | null> {
    let res: Response;
    try {
      res = await fetch(this.url(path, options.query), {
        method,
        headers: {
          authorization: `Bearer ${this.target.token}`,
          accept: options.text ? "text/plain" : "application/json",
          ...(options.body === undefined
            ? {}
            : { "content-type": options.contentType ?? "application/json" }),
        },
        body: options.body === undefined ? undefined : JSON.stringify(options.body),
        signal: AbortSignal.timeout(REST_TIMEOUT_MS),
      });
    } catch {
      throw new BackendError(
        "backend_unreachable",
        `The Kubernetes API does not answer (${meaning.what}).`,
        true,
      );
    }
    const text = await res.text();
    if (res.ok) return { status: res.status, body: options.text ? text : safeJson(text) };
    if (res.status === 404 && meaning.notFound === undefined) return null;
    throw this.refusal(res.status, safeJson(text) as KubeStatus | null, meaning);
  }

  /** Creates an object; on 409 AlreadyExists, null (the caller decides what "exists" means). */
  async create(resource: string, body: unknown, meaning: CallMeaning): Promise<KubeObject | null> {
    try {
      const res = await this.call(
        "POST",
        this.path(resource),
        { notFound: "not_found", ...meaning },
        { body },
      );
      return (res?.body ?? null) as KubeObject | null;
    } catch (e) {
      if (e instanceof BackendError && e.code === "already_exists") return null;
      throw e;
    }
  }

  async get(resource: string, name: string, meaning: CallMeaning): Promise<KubeObject | null> {
    const res = await this.call("GET", this.path(resource, name), meaning);
    return (res?.body ?? null) as KubeObject | null;
  }

  async replace(resource: string, name: string, body: unknown, meaning: CallMeaning): Promise<void> {
    await this.call("PUT", this.path(resource, name), { notFound: "not_found", ...meaning }, { body });
  }

  /** Deletes an object; true if it was there. 404 is success (idempotent). */
  async remove(
    resource: string,
    name: string,
    meaning: CallMeaning,
    graceSeconds?: number,
  ): Promise<boolean> {
    const query = new URLSearchParams();
    if (graceSeconds !== undefined) query.set("gracePeriodSeconds", String(graceSeconds));
    const res = await this.call("DELETE", this.path(resource, name), meaning, { query });
    return res !== null;
  }

  async list(resource: string, labelSelector: string, meaning: CallMeaning): Promise<KubeObject[]> {
    const res = await this.call(
      "GET",
      this.path(resource),
      { notFound: "not_found", ...meaning },
      {
        query: new URLSearchParams({ labelSelector }),
      },
    );
    const items = (res?.body as { items?: unknown } | null)?.items;
    return Array.isArray(items) ? (items as KubeObject[]) : [];
  }

  async patch(
    path: string,
    body: unknown,
    contentType: string,
    meaning: CallMeaning,
  ): Promise<KubeObject | null> {
    const res = await this.call("PATCH", path, meaning, { body, contentType });
    return (res?.body ?? null) as KubeObject | null;
  }

  /** A container's log (stdout and stderr interleaved, as the kubelet keeps them). */
  async log(
    pod: string,
    container: string,
    limitBytes: number,
    meaning: CallMeaning,
  ): Promise<string | null> {
    const res = await this.call("GET", this.path("pods", pod, "log"), meaning, {
      query: new URLSearchParams({ container, limitBytes: String(limitBytes) }),
      text: true,
    });
    return res === null ? null : String(res.body);
  }

  /**
   * Runs a command in a container through pods/{name}/exec over WebSocket (v5.channel.k8s.io,
   * falling back to v4): stdin on channel 0 (then, on v5, closed with the CLOSE signal on 255),
   * stdout 1, stderr 2, and the Status on 3, whose NonZeroExitCode cause carries the exit code.
   */
  async exec(
    pod: string,
    container: string,
    command: string[],
    options: { stdin?: string; timeoutMs: number },
    meaning: CallMeaning,
  ): Promise<ExecResult> {
    const res = await this.execBytes(pod, container, command, options, meaning);
    return { ...res, stdout: new TextDecoder().decode(res.stdout) };
  }

  /**
   * exec with stdout as bytes and stdin as text or a byte stream (ExecOptions). A stream given is
   * always consumed or cancelled, whatever happens.
   */
  async execBytes(
    pod: string,
    container: string,
    command: string[],
    options: ExecOptions,
    meaning: CallMeaning,
  ): Promise<ExecBytesResult> {
    const input = options.stdin;
    try {
      return await this.execOnce(pod, container, command, options, meaning);
    } finally {
      if (typeof input === "object" && !input.locked) await input.cancel().catch(() => {});
    }
  }

  private async execOnce(
    pod: string,
    container: string,
    command: string[],
    options: ExecOptions,
    meaning: CallMeaning,
  ): Promise<ExecBytesResult> {
    const query = new URLSearchParams();
    for (const c of command) query.append("command", c);
    query.set("container", container);
    if (options.stdin !== undefined) query.set("stdin", "true");
    query.set("stdout", "true");
    query.set("stderr", "true");
    let res: Response;
    // A deadline for the upgrade only: the socket then lives by options.timeoutMs.
    const upgrade = new AbortController();
    const deadline = setTimeout(() => upgrade.abort(), REST_TIMEOUT_MS);
    try {
      res = await fetch(this.url(this.path("pods", pod, "exec"), query), {
        headers: {
          upgrade: "websocket",
          authorization: `Bearer ${this.target.token}`,
          "sec-websocket-protocol": EXEC_PROTOCOLS.join(", "),
        },
        signal: upgrade.signal,
      });
      clearTimeout(deadline);
    } catch {
      clearTimeout(deadline);
      throw new BackendError(
        "backend_unreachable",
        `The Kubernetes API does not answer (${meaning.what}).`,
        true,
      );
    }
    const ws = (res as Response & { webSocket?: UpgradedSocket | null }).webSocket;
    if (res.status !== 101 || !ws) {
      const text = await res.text().catch(() => "");
      throw this.refusal(res.status === 101 ? 502 : res.status, safeJson(text) as KubeStatus | null, meaning);
    }
    const protocol = res.headers.get("sec-websocket-protocol") as ExecResult["protocol"] | null;
    ws.accept();
    if (!protocol || !EXEC_PROTOCOLS.includes(protocol)) {
      ws.close(1002, "no channel protocol");
      throw new BackendError(
        "backend_error",
        `The Kubernetes API offered no exec protocol this client speaks (${meaning.what}).`,
      );
    }
    if (typeof options.stdin === "object" && protocol !== "v5.channel.k8s.io") {
      ws.close(1000);
      throw new BackendError(
        "not_supported",
        `The Kubernetes API offered only ${protocol}, which cannot close stdin: ${meaning.what} needs v5.channel.k8s.io (Kubernetes 1.30 or later)`,
      );
    }
    // Binary frames as ArrayBuffer, in order (a Blob would be read asynchronously).
    ws.binaryType = "arraybuffer";
    const out: Uint8Array[] = [];
    let outBytes = 0;
    let overflow = false;
    const err: Uint8Array[] = [];
    const statusBytes: Uint8Array[] = [];
    let ended = false;
    const closed = new Promise<"closed" | "timeout" | "overflow">((resolve) => {
      const timer = setTimeout(() => {
        ended = true;
        resolve("timeout");
      }, options.timeoutMs);
      const end = () => {
        clearTimeout(timer);
        ended = true;
        resolve(overflow ? "overflow" : "closed");
      };
      ws.addEventListener("close", end);
      ws.addEventListener("error", end);
      ws.addEventListener("message", (event) => {
        const data =
          event.data instanceof ArrayBuffer
            ? new Uint8Array(event.data)
            : typeof event.data === "string"
              ? new TextEncoder().encode(event.data)
              : null;
        if (!data || data.length === 0) return;
        const payload = data.subarray(1);
        if (data[0] === 1) {
          if (overflow) return;
          outBytes += payload.length;
          if (options.maxStdoutBytes !== undefined && outBytes > options.maxStdoutBytes) {
            overflow = true;
            out.length = 0;
            end();
            return;
          }
          out.push(payload);
        } else if (data[0] === 2) err.push(payload);
        else if (data[0] === 3) statusBytes.push(payload);
      });
    });
    const sendBytes = (bytes: Uint8Array) => {
      for (let at = 0; at < bytes.length && !ended; at += STDIN_FRAME) {
        const chunk = bytes.subarray(at, at + STDIN_FRAME);
        const frame = new Uint8Array(chunk.length + 1);
        frame[0] = 0;
        frame.set(chunk, 1);
        ws.send(frame);
      }
    };
    if (typeof options.stdin === "string") {
      sendBytes(new TextEncoder().encode(options.stdin));
      // v5 can say "no more stdin"; v4 cannot, so the runner reads one line, not to the end.
      if (protocol === "v5.channel.k8s.io") ws.send(new Uint8Array([255, 0]));
    } else if (options.stdin !== undefined) {
      // A program may stop reading early (bw-unpack refusing the first entry) and end the exec:
      // then the rest of the stream is cancelled, not sent.
      const reader = options.stdin.getReader();
      try {
        for (;;) {
          const next = await Promise.race([reader.read(), closed.then(() => null)]);
          if (next === null || ended) break;
          if (next.done) {
            ws.send(new Uint8Array([255, 0]));
            break;
          }
          sendBytes(next.value);
        }
      } catch {
        // The stream failed (or the socket): the exec is ended below, its Status says no success.
        ended = true;
        try {
          ws.close(1000);
        } catch {}
        await reader.cancel().catch(() => {});
        throw new BackendError(
          "backend_unreachable",
          `The input of the Kubernetes exec could not be sent (${meaning.what}).`,
          true,
        );
      }
      await reader.cancel().catch(() => {});
    }
    const how = await closed;
    try {
      ws.close(1000);
    } catch {}
    if (how === "overflow") {
      throw new BackendError(
        "sandbox_failed",
        `The Kubernetes exec wrote more than ${options.maxStdoutBytes} bytes to stdout (${meaning.what}).`,
      );
    }
    if (how === "timeout") {
      throw new BackendError(
        "backend_unreachable",
        `The Kubernetes exec did not finish in time (${meaning.what}).`,
        true,
      );
    }
    const statusText = decode(statusBytes);
    const status = safeJson(statusText) as KubeStatus | null;
    if (!status) {
      throw new BackendError(
        "backend_unreachable",
        `The Kubernetes exec ended without a status (${meaning.what}).`,
        true,
      );
    }
    let exitCode: number;
    if (status.status === "Success") {
      exitCode = 0;
    } else {
      const cause = status.details?.causes?.find((c) => c.reason === "ExitCode");
      if (status.reason !== "NonZeroExitCode" || !cause || !/^[0-9]+$/.test(cause.message ?? "")) {
        throw new BackendError(
          "sandbox_failed",
          this.scrub(
            `Kubernetes could not run the command (${meaning.what}): ${status.message ?? status.reason ?? "failed"}`,
          ),
        );
      }
      exitCode = Number(cause.message);
    }
    return { exitCode, stdout: concat(out), stderr: decode(err), protocol };
  }

  private refusal(status: number, body: KubeStatus | null, meaning: CallMeaning): BackendError {
    const said = this.scrub(`${body?.reason ?? `HTTP ${status}`}${body?.message ? `: ${body.message}` : ""}`);
    const msg = `Kubernetes refused to ${meaning.what} (${status} ${said})`;
    if (status === 409) return new BackendError("already_exists", msg);
    if (status === 401) {
      return new BackendError(
        "backend_error",
        `The Kubernetes API refused the service account token (${meaning.what}: 401).`,
      );
    }
    if (status === 403) return new BackendError(meaning.forbidden ?? "backend_error", msg);
    if (status === 404) return new BackendError(meaning.notFound ?? "not_found", msg);
    if (status === 429 || status >= 500) return new BackendError("backend_unreachable", msg, true);
    if (status === 422 || status === 400) return new BackendError("sandbox_failed", msg);
    return new BackendError("backend_error", msg);
  }

  /** The message with the token and every hidden value cut out, and bounded. */
  private scrub(text: string): string {
    let out = text;
    for (const secret of [this.target.token, ...this.hidden()]) {
      if (secret.length >= 4) out = out.split(secret).join("[redacted]");
    }
    return out.length > 400 ? `${out.slice(0, 400)}…` : out;
  }
}

function decode(chunks: Uint8Array[]): string {
  return new TextDecoder().decode(concat(chunks));
}

function concat(chunks: Uint8Array[]): Uint8Array {
  const total = chunks.reduce((n, c) => n + c.length, 0);
  const all = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    all.set(c, at);
    at += c.length;
  }
  return all;
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}
