import { PROXY_PORTS, type Resources } from "@benchwright/shared/contract/local-agent";
import type { RoutingMode } from "@benchwright/shared/contract/policy";
import { PLATFORM_HOSTS } from "@benchwright/shared/contract/proxy-wire";
import { NON_PUBLIC_V4 as NON_PUBLIC_TABLE } from "@benchwright/shared/policy/addresses";

// The Kubernetes objects of the sandbox0 backend, as plain JSON (core/v1 and networking.k8s.io/v1).
// Pure functions of what the broker asked for: the contract tests compare them field by field.

/**
 * Where the pod spec puts things (the init container's `bw-init tools` fills /bw/tools). The exec
 * runner's wrapper there sets BW_EXEC_DIR to execDir (proxy-image/Dockerfile).
 */
export const POD_PATHS = {
  /** Read-only in the work container: node, its libraries, the runner, the wiring program. */
  tools: "/bw/tools",
  /** Writable, the sandbox's uid: the run CA (wiring), exec state (runner). */
  state: "/bw/run",
  runner: "/bw/tools/bin/bw-exec",
  /** Bundles in and artifacts out, run as the pod's uid (contract/bundle.ts). */
  unpack: "/bw/tools/bin/bw-unpack",
  collect: "/bw/tools/bin/bw-collect",
  /** A setup image's capture: the working directory as a tar (sandbox0/setup-images.ts). */
  layer: "/bw/tools/bin/bw-layer",
  execDir: "/bw/run/exec",
  caDir: "/bw/run/ca",
  caBundle: "/bw/run/ca/bundle.crt",
  /**
   * The home volume, shared by setup and execute: the coordinator's working directory
   * (steps/stages.ts WORK_DIR), where the bundle is unpacked, commands run and $BW_OUT lies.
   */
  home: "/home/sandbox",
} as const;

/**
 * The containers of a work pod: `work` runs the execute stage (and everything of ours that needs
 * no root), `setup` the setup stage as root (only when the sandbox has one), `bw-seal` ends it
 * and rewrites the hosts file (docs/sandbox0.md, *The two stages*).
 */
export const CONTAINERS = { work: "work", setup: "setup", seal: "bw-seal" } as const;

/** The routing a work pod was made for: its seal and hosts rewrites must agree with it. */
export const ROUTING_ANNOTATION = "benchwright.dev/routing";
/** A setup image's builder: its working directory may be captured after seal (captureLayer). */
export const CAPTURE_ANNOTATION = "benchwright.dev/capture";
/** Where a pod started from a setup image copies the image's working directory from (init container). */
export const HOME_INIT = "bw-home";

/**
 * The setup container's capabilities: what package managers and `chown` need as root (apt's
 * sandbox user, dpkg's chown and chmod, writing where root does not own). No NET_ADMIN or NET_RAW
 * (the network), SYS_ADMIN (mounts), SYS_PTRACE, MKNOD, and no KILL: the sealer holds a capability
 * setup lacks, so setup's root cannot ptrace it (the kernel's rule: a tracer needs a superset of
 * the target's capabilities, or CAP_SYS_PTRACE).
 */
export const SETUP_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID"];

export const LABELS = {
  managedBy: "app.kubernetes.io/managed-by",
  run: "benchwright.dev/run",
  sandbox: "benchwright.dev/sandbox",
  kind: "benchwright.dev/kind",
} as const;
export const MANAGED_BY = "benchwright";
/** An environment's pull Secret (pullSecret) carries its id here. */
export const ENVIRONMENT_LABEL = "benchwright.dev/environment";
export const EXEC_ID_ANNOTATION = "benchwright.dev/exec-id";

/** The one uid of every benchwright container but the catch-all redirect (the image's `proxy`). */
export const SANDBOX_UID = 10001;

export type SandboxKindLabel = "proxy" | "work" | "task" | "orchestrator";

/** Kubernetes label values: the sandbox and run ids go in as they are (they are the mapping back). */
const LABEL_VALUE = /^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$/;
export const isLabelValue = (v: string) => LABEL_VALUE.test(v);

/** FNV-1a, 32 bits, hex: tells apart ids that lowercase to the same name. Not a secret. */
function fnv(text: string): string {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h.toString(16).padStart(8, "0");
}

/**
 * The object name of a sandbox (pod of a work sandbox, Service, NetworkPolicy): `bw-` + the id
 * lowercased with anything outside [a-z0-9-] as `-`, cut to 40, + `-` + a hash of the exact id.
 * A DNS-1035 label (Service names need one), at most 52 characters. Not reversed: the id is in
 * the object's `benchwright.dev/sandbox` label.
 */
export function objectName(sandboxId: string): string {
  const slug = sandboxId
    .toLowerCase()
    .replace(/[^a-z0-9-]/g, "-")
    .slice(0, 40);
  return `bw-${slug}-${fnv(sandboxId)}`;
}

/** A proxy launch's pod (one per exec id: a relaunch never waits for the old pod to go). */
export const proxyPodName = (sandboxId: string, execId: string) => `${objectName(sandboxId)}-${fnv(execId)}`;
/** The proxy's credentials (one per proxy sandbox, so one per run). */
export const secretName = (sandboxId: string) => `${objectName(sandboxId)}-creds`;

/**
 * An environment's pull Secret (its setup images' pull credential, images/pull-credential.ts):
 * one per environment, named by its id like a sandbox's objects are.
 */
export const pullSecretName = (environmentId: string) =>
  `${objectName(environmentId).replace(/^bw-/, "bw-pull-")}`;

export function labels(runId: string, sandboxId: string, kind: SandboxKindLabel): Record<string, string> {
  return {
    [LABELS.managedBy]: MANAGED_BY,
    [LABELS.run]: runId,
    [LABELS.sandbox]: sandboxId,
    [LABELS.kind]: kind,
  };
}

/** Never a destination of a sandbox: the platform's one table (shared/policy/addresses.ts). */
export const NON_PUBLIC_V4 = NON_PUBLIC_TABLE.map((r) => r.cidr);

const PROXY_POD_PORTS = [
  { port: PROXY_PORTS.tls, protocol: "TCP" },
  { port: PROXY_PORTS.http, protocol: "TCP" },
  { port: PROXY_PORTS.explicit, protocol: "TCP" },
  { port: PROXY_PORTS.dns, protocol: "TCP" },
  { port: PROXY_PORTS.dns, protocol: "UDP" },
];

const KUBE_DNS = {
  to: [
    {
      namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "kube-system" } },
      podSelector: { matchLabels: { "k8s-app": "kube-dns" } },
    },
  ],
  ports: [
    { port: 53, protocol: "UDP" },
    { port: 53, protocol: "TCP" },
  ],
};

const PUBLIC_INTERNET = { to: [{ ipBlock: { cidr: "0.0.0.0/0", except: NON_PUBLIC_V4 } }] };

const podBasics = {
  restartPolicy: "Never",
  automountServiceAccountToken: false,
  enableServiceLinks: false,
  hostNetwork: false,
  hostPID: false,
  hostIPC: false,
};

const podSecurity = {
  runAsNonRoot: true,
  runAsUser: SANDBOX_UID,
  runAsGroup: SANDBOX_UID,
  fsGroup: SANDBOX_UID,
  seccompProfile: { type: "RuntimeDefault" },
};

const nonRootContainer = (readOnlyRootFilesystem: boolean) => ({
  runAsNonRoot: true,
  runAsUser: SANDBOX_UID,
  runAsGroup: SANDBOX_UID,
  allowPrivilegeEscalation: false,
  readOnlyRootFilesystem,
  capabilities: { drop: ["ALL"] },
});

// ---- proxy sandbox ----

/**
 * The proxy's Service: its clusterIP is what default-routed work pods' hosts files point at.
 * 443/80 map to the proxy's unprivileged 8443/8080 (the proxy runs without capabilities, so it
 * cannot listen on 443 itself); the proxy's own ports are there too.
 */
export function proxyService(ns: string, runId: string, sandboxId: string) {
  return {
    apiVersion: "v1",
    kind: "Service",
    metadata: { name: objectName(sandboxId), namespace: ns, labels: labels(runId, sandboxId, "proxy") },
    spec: {
      type: "ClusterIP",
      selector: { [LABELS.sandbox]: sandboxId, [LABELS.kind]: "proxy" },
      ports: [
        { name: "https", port: 443, targetPort: PROXY_PORTS.tls, protocol: "TCP" },
        { name: "http", port: 80, targetPort: PROXY_PORTS.http, protocol: "TCP" },
        { name: "tls", port: PROXY_PORTS.tls, targetPort: PROXY_PORTS.tls, protocol: "TCP" },
        { name: "http-alt", port: PROXY_PORTS.http, targetPort: PROXY_PORTS.http, protocol: "TCP" },
        { name: "explicit", port: PROXY_PORTS.explicit, targetPort: PROXY_PORTS.explicit, protocol: "TCP" },
        { name: "dns-tcp", port: PROXY_PORTS.dns, targetPort: PROXY_PORTS.dns, protocol: "TCP" },
        { name: "dns-udp", port: PROXY_PORTS.dns, targetPort: PROXY_PORTS.dns, protocol: "UDP" },
      ],
    },
  };
}

/**
 * The proxy pod's policy: in, only its own run's work/task/orchestrator pods on the proxy ports;
 * out, the cluster's DNS and the public internet (the control plane and upstreams), never a
 * private, CGNAT, loopback or link-local address.
 */
export function proxyNetworkPolicy(ns: string, runId: string, sandboxId: string) {
  return {
    apiVersion: "networking.k8s.io/v1",
    kind: "NetworkPolicy",
    metadata: { name: objectName(sandboxId), namespace: ns, labels: labels(runId, sandboxId, "proxy") },
    spec: {
      podSelector: { matchLabels: { [LABELS.sandbox]: sandboxId, [LABELS.kind]: "proxy" } },
      policyTypes: ["Ingress", "Egress"],
      ingress: [
        {
          from: [
            {
              podSelector: {
                matchLabels: { [LABELS.run]: runId },
                matchExpressions: [
                  { key: LABELS.kind, operator: "In", values: ["work", "task", "orchestrator"] },
                ],
              },
            },
          ],
          ports: PROXY_POD_PORTS,
        },
      ],
      egress: [KUBE_DNS, PUBLIC_INTERNET],
    },
  };
}

export function proxySecret(ns: string, runId: string, sandboxId: string, values: Record<string, string>) {
  const data: Record<string, string> = {};
  for (const [k, v] of Object.entries(values)) data[k] = base64(v);
  return {
    apiVersion: "v1",
    kind: "Secret",
    metadata: { name: secretName(sandboxId), namespace: ns, labels: labels(runId, sandboxId, "proxy") },
    type: "Opaque",
    data,
  };
}

/** Normal proxy resources, and the floor a paused (frozen) proxy is resized to. */
export const PROXY_CPU = {
  running: { requests: "250m", limits: "1" },
  paused: { requests: "10m", limits: "10m" },
};

export function proxyPod(o: {
  ns: string;
  runId: string;
  sandboxId: string;
  execId: string;
  image: string;
  argv: string[];
  plainEnv: Record<string, string>;
  secretKeys: string[];
  serviceIp: string;
}) {
  const env: Array<Record<string, unknown>> = [
    // The pod's own address, for the proxy's list of addresses it never forwards to.
    { name: "BW_POD_IP", valueFrom: { fieldRef: { fieldPath: "status.podIP" } } },
    ...Object.entries(o.plainEnv).map(([name, value]) => ({ name, value })),
    ...o.secretKeys.map((name) => ({
      name,
      valueFrom: { secretKeyRef: { name: secretName(o.sandboxId), key: name } },
    })),
    { name: "BW_OWN_ADDRESSES", value: `$(BW_POD_IP),${o.serviceIp}` },
  ];
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: {
      name: proxyPodName(o.sandboxId, o.execId),
      namespace: o.ns,
      labels: labels(o.runId, o.sandboxId, "proxy"),
      annotations: { [EXEC_ID_ANNOTATION]: o.execId },
    },
    spec: {
      ...podBasics,
      terminationGracePeriodSeconds: 5,
      securityContext: podSecurity,
      containers: [
        {
          name: "proxy",
          image: o.image,
          command: o.argv,
          env,
          ports: [
            { name: "tls", containerPort: PROXY_PORTS.tls, protocol: "TCP" },
            { name: "http", containerPort: PROXY_PORTS.http, protocol: "TCP" },
            { name: "explicit", containerPort: PROXY_PORTS.explicit, protocol: "TCP" },
            { name: "dns-tcp", containerPort: PROXY_PORTS.dns, protocol: "TCP" },
            { name: "dns-udp", containerPort: PROXY_PORTS.dns, protocol: "UDP" },
          ],
          securityContext: nonRootContainer(true),
          resources: {
            requests: { cpu: PROXY_CPU.running.requests, memory: "256Mi" },
            limits: { cpu: PROXY_CPU.running.limits, memory: "512Mi" },
          },
          // A paused proxy is resized in place, never restarted: a restart would lose its CA key.
          resizePolicy: [
            { resourceName: "cpu", restartPolicy: "NotRequired" },
            { resourceName: "memory", restartPolicy: "NotRequired" },
          ],
          // The root filesystem is read-only; the spool (BW_SPOOL_DIR) lives under /tmp.
          volumeMounts: [{ name: "tmp", mountPath: "/tmp" }],
        },
      ],
      volumes: [{ name: "tmp", emptyDir: { sizeLimit: "64Mi" } }],
    },
  };
}

/** The in-place resize of a proxy pod's CPU (strategic merge patch on pods/{name}/resize). */
export function proxyResize(paused: boolean) {
  const cpu = paused ? PROXY_CPU.paused : PROXY_CPU.running;
  return {
    spec: {
      containers: [
        { name: "proxy", resources: { requests: { cpu: cpu.requests }, limits: { cpu: cpu.limits } } },
      ],
    },
  };
}

/**
 * The kubelet's credential for an environment's setup images (a dockerconfigjson Secret): the
 * registry's realm exchanges it for a pull token on that environment's repository only. No pod
 * mounts it; pods started from the environment's images name it in imagePullSecrets.
 */
export function pullSecret(o: { ns: string; environmentId: string; registryHost: string; password: string }) {
  const auth = base64(`${o.environmentId}:${o.password}`);
  const config = { auths: { [o.registryHost]: { username: o.environmentId, password: o.password, auth } } };
  return {
    apiVersion: "v1",
    kind: "Secret",
    metadata: {
      name: pullSecretName(o.environmentId),
      namespace: o.ns,
      labels: { [LABELS.managedBy]: MANAGED_BY, [ENVIRONMENT_LABEL]: o.environmentId },
    },
    type: "kubernetes.io/dockerconfigjson",
    data: { ".dockerconfigjson": base64(JSON.stringify(config)) },
  };
}
// ---- work / task / orchestrator sandboxes ----

export function workNetworkPolicy(o: {
  ns: string;
  runId: string;
  sandboxId: string;
  kind: SandboxKindLabel;
  routing: RoutingMode;
}) {
  const toProxy = {
    to: [{ podSelector: { matchLabels: { [LABELS.run]: o.runId, [LABELS.kind]: "proxy" } } }],
    ports: PROXY_POD_PORTS,
  };
  return {
    apiVersion: "networking.k8s.io/v1",
    kind: "NetworkPolicy",
    metadata: {
      name: objectName(o.sandboxId),
      namespace: o.ns,
      labels: labels(o.runId, o.sandboxId, o.kind),
    },
    spec: {
      podSelector: { matchLabels: { [LABELS.sandbox]: o.sandboxId } },
      policyTypes: ["Ingress", "Egress"],
      ingress: [],
      egress: o.routing === "catch-all" ? [toProxy] : [toProxy, KUBE_DNS, PUBLIC_INTERNET],
    },
  };
}

/**
 * The work container's resources: the run's limits as the container's (memory: the kernel kills
 * past it, the pod's cgroup; CPU: throttled), requests at most what the defaults ask. Without
 * resources, the defaults (no CPU limit, 4 Gi memory). Pids have no per-pod field in Kubernetes:
 * the kubelet's podPidsLimit bounds every pod of a node alike (docs/sandbox0.md).
 */
export function workResources(r: Resources | undefined) {
  if (!r) return { requests: { cpu: "500m", memory: "1Gi" }, limits: { memory: "4Gi" } };
  const millis = (cpus: number) => `${Math.max(1, Math.round(cpus * 1000))}m`;
  return {
    requests: { cpu: millis(Math.min(r.cpus, 0.5)), memory: `${Math.min(r.memoryMb, 1024)}Mi` },
    limits: { cpu: millis(r.cpus), memory: `${r.memoryMb}Mi` },
  };
}

export function workPod(o: {
  ns: string;
  runId: string;
  sandboxId: string;
  kind: SandboxKindLabel;
  routing: RoutingMode;
  proxyImage: string;
  workImage: string;
  /** The hosts-file target: the proxy Service (default) or the proxy pod (catch-all). */
  proxyAddress: string;
  hostsFile: string[];
  resources?: Resources;
  /** The sandbox has a setup stage: the pod gets its root `setup` container. */
  setup?: boolean;
  /** A setup image's builder (CAPTURE_ANNOTATION). */
  capture?: boolean;
  /**
   * Start from a setup image, `<host>/<repository>@sha256:…` (never a tag: case P3), pulled with
   * the environment's pull Secret: it is the work container's image, and an init container from
   * the same digest fills the working directory from it. No setup stage, so no setup container.
   */
  layer?: { image: string; pullSecret: string };
}) {
  const workImage = o.layer?.image ?? o.workImage;
  const withSetup = Boolean(o.setup) && !o.layer;
  const hostnames =
    o.routing === "default" ? [...new Set([...o.hostsFile, ...PLATFORM_HOSTS])] : [...PLATFORM_HOSTS];
  const tools = { name: "bw-tools", mountPath: POD_PATHS.tools };
  const state = { name: "bw-run", mountPath: POD_PATHS.state };
  const home = { name: "home", mountPath: POD_PATHS.home };
  const redirect = {
    name: "bw-redirect",
    image: o.proxyImage,
    command: ["bw-init", "redirect", o.proxyAddress],
    // The only container of the pod with NET_ADMIN: it installs the catch-all rules in the pod's
    // network namespace and exits before anything else runs.
    securityContext: {
      runAsNonRoot: false,
      runAsUser: 0,
      runAsGroup: 0,
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      capabilities: { drop: ["ALL"], add: ["NET_ADMIN"] },
    },
    resources: { requests: { cpu: "10m", memory: "16Mi" }, limits: { memory: "64Mi" } },
  };
  const toolsInit = {
    name: "bw-tools",
    image: o.proxyImage,
    command: ["bw-init", "tools"],
    securityContext: nonRootContainer(true),
    resources: { requests: { cpu: "10m", memory: "32Mi" }, limits: { memory: "128Mi" } },
    volumeMounts: [tools, state, home],
  };
  // The working directory is a volume that shadows the image's /home/sandbox: filled from the
  // image here, as the pod's uid (so what it copies belongs to that uid), before anything runs.
  const homeInit = {
    name: HOME_INIT,
    image: workImage,
    command: ["/bin/sh", "-c", `cp -a ${POD_PATHS.home}/. /bw/home/`],
    securityContext: nonRootContainer(true),
    resources: { requests: { cpu: "100m", memory: "64Mi" }, limits: { memory: "256Mi" } },
    volumeMounts: [{ name: "home", mountPath: "/bw/home" }],
  };
  const work = {
    name: CONTAINERS.work,
    image: workImage,
    command: [POD_PATHS.runner, "hold"],
    // Execs start here (the runner passes its cwd on): the commands' working directory.
    workingDir: POD_PATHS.home,
    env: [{ name: "HOME", value: POD_PATHS.home }],
    securityContext: nonRootContainer(false),
    resources: workResources(o.resources),
    volumeMounts: [{ ...tools, readOnly: true }, state, home],
  };
  // The setup stage: the work image as root, with its own runner state (its /bw/run) and the run
  // CA read-only; what it gives the execute stage is only what it writes to the home volume.
  const setup = {
    name: CONTAINERS.setup,
    image: workImage,
    command: [POD_PATHS.runner, "hold"],
    // Execs start here (the runner passes its cwd on): the commands' working directory.
    workingDir: POD_PATHS.home,
    env: [{ name: "HOME", value: POD_PATHS.home }],
    securityContext: {
      runAsNonRoot: false,
      runAsUser: 0,
      runAsGroup: 0,
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: false,
      capabilities: { drop: ["ALL"], add: SETUP_CAPABILITIES },
    },
    // Setup and execute never run at once: setup asks little and may use the run's limits.
    resources: { requests: { cpu: "100m", memory: "128Mi" }, limits: workResources(o.resources).limits },
    volumeMounts: [
      { ...tools, readOnly: true },
      { name: "bw-setup-run", mountPath: POD_PATHS.state },
      { name: "bw-run", mountPath: POD_PATHS.caDir, subPath: "ca", readOnly: true },
      home,
    ],
  };
  // Ends the setup stage and rewrites the pod's /etc/hosts (bw-init seal, hosts). Root with only
  // KILL; its root filesystem is writable because the runtime mounts /etc/resolv.conf read-only
  // in a container whose root is, and the sealer restores that file.
  const sealer = {
    name: CONTAINERS.seal,
    image: o.proxyImage,
    command: ["bw-init", "sealer"],
    securityContext: {
      runAsNonRoot: false,
      runAsUser: 0,
      runAsGroup: 0,
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: false,
      capabilities: { drop: ["ALL"], add: ["KILL"] },
    },
    resources: { requests: { cpu: "10m", memory: "16Mi" }, limits: { memory: "128Mi" } },
  };
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: {
      name: objectName(o.sandboxId),
      namespace: o.ns,
      labels: labels(o.runId, o.sandboxId, o.kind),
      annotations: {
        [ROUTING_ANNOTATION]: o.routing,
        ...(o.capture && withSetup ? { [CAPTURE_ANNOTATION]: "true" } : {}),
      },
    },
    spec: {
      ...podBasics,
      // The pause process is PID 1 and reaps the runner's detached supervisors; the sealer sees
      // the setup stage's processes.
      shareProcessNamespace: true,
      terminationGracePeriodSeconds: 5,
      dnsPolicy: "ClusterFirst",
      hostAliases: [{ ip: o.proxyAddress, hostnames }],
      securityContext: podSecurity,
      ...(o.layer ? { imagePullSecrets: [{ name: o.layer.pullSecret }] } : {}),
      initContainers: [
        ...(o.routing === "catch-all" ? [redirect] : []),
        toolsInit,
        ...(o.layer ? [homeInit] : []),
      ],
      containers: withSetup ? [work, setup, sealer] : [work, sealer],
      volumes: [
        { name: "bw-tools", emptyDir: {} },
        { name: "bw-run", emptyDir: {} },
        { name: "home", emptyDir: {} },
        ...(withSetup ? [{ name: "bw-setup-run", emptyDir: {} }] : []),
      ],
    },
  };
}

function base64(text: string): string {
  const bytes = new TextEncoder().encode(text);
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin);
}
