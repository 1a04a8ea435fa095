import { z } from "zod";
import { isCanonicalHostName } from "./host-name";
import { RoutingMode } from "./policy";
import { ProxyReady } from "./proxy-wire";

// The contract of the wiring program (proxy-image/src/wiring/wiring.ts, shipped as wiring.cjs), which
// runs in a work or task sandbox's setup stage: it reads one WiringInput as JSON on stdin, trusts
// the run CA, writes the hosts-file redirect, proves both work, and prints one WiringProof as
// JSON on stdout. With `installed` it writes nothing and proves what was installed from outside
// (after a setup stage, in the execute stage). Imported by the program and by whoever starts it, so the two cannot drift.
// Pure zod (no node: imports): workerd loads it too.

/** The program's exit codes. */
export const WIRING_EXIT = { ok: 0, probeFailed: 1, badInput: 2 } as const;

const AbsolutePath = z
  .string()
  .min(2)
  .max(4096)
  .regex(/^\/[^\0]*$/, "must be an absolute path")
  .refine((p) => !p.split("/").includes(".."), "must not contain .. segments");

const IPV4 =
  /^(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(?:\.(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$/;

/** Both the wiring and its re-install: under catch-all the redirect takes every host. */
function noHostsFileUnderCatchAll(input: { mode: RoutingMode; hostsFile: string[] }, ctx: z.RefinementCtx) {
  if (input.mode === "catch-all" && input.hostsFile.length > 0) {
    ctx.addIssue({
      code: "custom",
      path: ["hostsFile"],
      message: "must be empty under catch-all routing (the redirect takes every host)",
    });
  }
}

/**
 * An IPv4 `address:port` outside the sandbox that catch-all routing must make unreachable. Not
 * port 80 or 443: those are redirected to the proxy by design, so a connect would succeed.
 */
export const DirectTarget = z
  .string()
  .regex(/^[0-9.]+:[0-9]{1,5}$/, "must be ipv4:port")
  .refine((t) => IPV4.test(t.slice(0, t.lastIndexOf(":"))), "must be ipv4:port")
  .refine((t) => {
    const port = Number(t.slice(t.lastIndexOf(":") + 1));
    return port >= 1 && port <= 65_535;
  }, "the port must be 1-65535")
  .refine((t) => !/:(?:80|443)$/.test(t), "ports 80 and 443 go to the proxy by design; pick another");

export const WiringInput = z
  .strictObject({
    mode: RoutingMode,
    /** The run CA's certificate, as the proxy reported it in its ready call. */
    caCertPem: ProxyReady.shape.caCertPem,
    /** The proxy's address as this sandbox sees it: the hosts-file target. */
    proxyAddress: z.ipv4({ error: "must be an IPv4 address" }),
    /** The policy's hostsFile: exact host names redirected to the proxy (default mode only). */
    hostsFile: z
      .array(z.string().refine(isCanonicalHostName, "not a canonical exact host name"))
      .max(10_000)
      .default([]),
    probe: z.strictObject({
      /** catch-all only: a direct connection to this must fail. */
      directTarget: DirectTarget.nullable(),
    }),
    /** Where the run CA is written (a tmpfs in the sandbox). */
    caDir: AbsolutePath.default("/run/benchwright"),
    /** The system CA bundle (the sandbox's own writable copy); the run CA is appended to it. */
    caBundlePath: AbsolutePath.default("/etc/ssl/certs/ca-certificates.crt"),
    hostsPath: AbsolutePath.default("/etc/hosts"),
    /**
     * The backend wrote the hosts entries itself (a Kubernetes pod's hostAliases: the setup stage
     * there has no root). The wiring then checks each entry is there instead of writing it.
     */
    hostsInstalled: z.boolean().default(false),
    /**
     * Check only: the wiring's files (the CA file, the bundle, the hosts file) were re-installed
     * from outside the sandbox (the local agent's seal, after the setup stage). Nothing is
     * written; the program checks each of them, then probes as usual. Run in the execute stage.
     */
    installed: z.boolean().default(false),
    /** The port the HTTPS probe connects to (tests point it at an ephemeral listener). */
    probePort: z.number().int().min(1).max(65_535).default(443),
    /**
     * How the probe host is resolved. `system`: getaddrinfo, as every client in the sandbox will
     * (the real proof that the hosts file is honoured). `hosts-file`: read from hostsPath, for
     * tests that write a hosts file the system resolver does not read.
     */
    probeResolver: z.enum(["system", "hosts-file"]).default("system"),
  })
  .superRefine((input, ctx) => {
    noHostsFileUnderCatchAll(input, ctx);
    if (input.mode === "default" && input.probe.directTarget !== null) {
      ctx.addIssue({
        code: "custom",
        path: ["probe", "directTarget"],
        message: "must be null under default routing (direct egress is allowed there)",
      });
    }
  });
export type WiringInput = z.input<typeof WiringInput>;
export type WiringInputParsed = z.output<typeof WiringInput>;

export const WiringProbeName = z.enum([
  /** The run CA and hosts file could not be written: nothing else was tried. */
  "install",
  /** HTTPS to the probe host, verified against the bundle just written: 403 + probe header. */
  "tls_probe",
  /** catch-all: a direct connection to probe.directTarget must fail. */
  "direct_egress",
]);
export type WiringProbeName = z.infer<typeof WiringProbeName>;

export const WiringProbe = z.strictObject({
  name: WiringProbeName,
  expected: z.string(),
  observed: z.string(),
  ok: z.boolean(),
});
export type WiringProbe = z.infer<typeof WiringProbe>;

/** What the execute stage's environment must carry so that clients trust the run CA. */
export const WiringEnv = z.strictObject({
  /** The run CA alone (Node adds it to its built-in roots). */
  NODE_EXTRA_CA_CERTS: z.string(),
  /** The system bundle with the run CA appended (these clients replace their roots with it). */
  REQUESTS_CA_BUNDLE: z.string(),
  SSL_CERT_FILE: z.string(),
  CURL_CA_BUNDLE: z.string(),
});
export type WiringEnv = z.infer<typeof WiringEnv>;

export const WiringProof = z
  .strictObject({
    ok: z.boolean(),
    mode: RoutingMode,
    /** SHA-256 of the trusted CA certificate's DER, lowercase hex (as in ProxyReady). */
    caFingerprint256: ProxyReady.shape.caFingerprint256,
    /** The hosts-file lines the wiring owns (`<proxyAddress> <host>`). */
    hostsEntries: z.array(z.string()),
    probes: z.array(WiringProbe).min(1),
    env: WiringEnv,
  })
  .refine((p) => p.ok === p.probes.every((x) => x.ok), {
    message: "ok must be true exactly when every probe is",
    path: ["ok"],
  });
export type WiringProof = z.infer<typeof WiringProof>;

/**
 * `bw-wiring reinstall` (stdin: one WiringReinstall; stdout: one ReinstallResult): the wiring's
 * files written again from the control plane's copy, with no probe, by a backend whose setup
 * stage had root in the sandbox (E2B): at seal (everything), and for a vault edit mid-run (the
 * hosts block only: `caCertPem` null leaves the CA files alone). The hosts file's resolver order
 * is restored too (`hosts: files dns` in nsswitchPath): root could have made the resolver skip
 * the hosts file. Exit 0 written, 1 a file could not be written, 2 bad input.
 */
export const WiringReinstall = z
  .strictObject({
    mode: RoutingMode,
    proxyAddress: z.ipv4({ error: "must be an IPv4 address" }),
    hostsFile: z
      .array(z.string().refine(isCanonicalHostName, "not a canonical exact host name"))
      .max(10_000)
      .default([]),
    caCertPem: ProxyReady.shape.caCertPem.nullable(),
    caDir: AbsolutePath.default("/run/benchwright"),
    caBundlePath: AbsolutePath.default("/etc/ssl/certs/ca-certificates.crt"),
    hostsPath: AbsolutePath.default("/etc/hosts"),
    /**
     * null: the resolver order is not the caller's to restore (sandbox0's sealer rewrites the
     * pod's shared /etc/hosts, while each container's nsswitch.conf is its own image's).
     */
    nsswitchPath: AbsolutePath.nullable().default("/etc/nsswitch.conf"),
  })
  .superRefine(noHostsFileUnderCatchAll);
export type WiringReinstall = z.input<typeof WiringReinstall>;

export const ReinstallResult = z.strictObject({
  ok: z.boolean(),
  /** The hosts-file lines the wiring owns, as written. */
  hostsEntries: z.array(z.string()),
  /** ok false: which file could not be written, and why (an errno code). */
  error: z.string().optional(),
});
export type ReinstallResult = z.infer<typeof ReinstallResult>;
