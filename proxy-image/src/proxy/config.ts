import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { PlaceholderNonce } from "@benchwright/shared/contract/placeholder";
import { DEFAULT_VIEW_PORT } from "@benchwright/shared/contract/proxy-view";
import { z } from "zod";

// The proxy's configuration: environment variables, each overridable by a flag of the same name
// (BW_RUN_ID ↔ --run-id). Checked whole at start; a bad configuration refuses to start with a
// message naming the setting, never its value.

// 0 lets the OS pick a free port (tests); the ready call reports the ports actually bound.
const Port = z.coerce.number().int().min(0).max(65_535);

const Schema = z
  .object({
    BW_RUN_ID: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, "must be 1-64 of A-Z a-z 0-9 _ -"),
    BW_CONTROL_PLANE_URL: z.url({ protocol: /^https?$/, error: "must be an http(s) URL" }),
    BW_PROXY_TOKEN: z.string().min(16, "must be at least 16 characters"),
    BW_AUDIT_KEY: z.string().startsWith("whsec_", "must be a whsec_ key"),
    BW_SPOOL_DIR: z.string().min(1).default("/var/spool/benchwright"),
    BW_SPOOL_MAX_BYTES: z.coerce
      .number()
      .int()
      .min(4096)
      .default(8 * 1024 * 1024),
    BW_LISTEN_HOST: z.string().default("0.0.0.0"),
    BW_TLS_PORT: Port.default(443),
    BW_HTTP_PORT: Port.default(80),
    BW_EXPLICIT_PORT: Port.default(3128),
    /** Direct listeners (TLS, HTTP): connections dialled by address, DNAT'd here (I4); unset: none. */
    BW_DIRECT_TLS_PORT: Port.optional(),
    BW_DIRECT_HTTP_PORT: Port.optional(),
    /** The view's port, on 127.0.0.1 only (GET /view; `proxy.cjs view` reads it). */
    BW_VIEW_PORT: Port.default(DEFAULT_VIEW_PORT),
    /** The run's placeholder nonce (shared/contract/placeholder.ts); unset: no placeholder is swapped. */
    BW_PLACEHOLDER_NONCE: PlaceholderNonce.optional(),
    BW_POLICY_INTERVAL_MS: z.coerce.number().int().min(200).max(2000).default(1000),
    /** The catch-all resolver's port (UDP and TCP); unset: no resolver. */
    BW_DNS_PORT: Port.optional(),
    /** The IPv4 address the catch-all resolver answers every A query with. */
    BW_DNS_ANSWER: z.ipv4({ error: "must be an IPv4 address" }).default("198.18.0.1"),
    /** The proxy's own addresses, never a destination (comma-separated). */
    BW_OWN_ADDRESSES: z.string().default(""),
    // "off": every TLS connection is terminated, allowed hosts without a rule too (no splice).
    BW_SPLICE: z.enum(["on", "off"], { error: "must be on or off" }).default("on"),
    /** Test-only: extra upstream trust root (PEM file), e.g. the test suite's own CA. */
    BW_TEST_EXTRA_CA_FILE: z.string().optional(),
    /** Test-only: the same as inline PEM, for sandboxes that cannot see the suite's files. */
    BW_TEST_EXTRA_CA_PEM: z.string().startsWith("-----BEGIN CERTIFICATE-----", "must be PEM").optional(),
    /** Test-only: "host=ip:port,..." replacing DNS for the suite's own test hosts. */
    BW_TEST_ROUTES: z.string().optional(),
    /** Test-only: CIDRs the suite's test hosts live in, exempt from the private-address check. */
    BW_TEST_ALLOW_CIDRS: z.string().optional(),
  })
  .strict();

export type ProxyConfig = z.infer<typeof Schema> & {
  extraCaPem: string | undefined;
  testRoutes: Map<string, { address: string; port: number }>;
  testAllowCidrs: string[];
  ownAddresses: string[];
};

const KEYS = Object.keys(Schema.shape) as Array<keyof typeof Schema.shape>;
const flagOf = (key: string) => key.replace(/^BW_/, "").toLowerCase().replaceAll("_", "-");

export class ConfigError extends Error {}

/** The view's port for `proxy.cjs view`, which needs none of the proxy's other settings. */
export function viewPort(env: NodeJS.ProcessEnv): number {
  const parsed = Port.min(1)
    .default(DEFAULT_VIEW_PORT)
    .safeParse(env.BW_VIEW_PORT || undefined);
  if (!parsed.success) throw new ConfigError("BW_VIEW_PORT: must be a port number (1-65535)");
  return parsed.data;
}

export function loadProxyConfig(env: NodeJS.ProcessEnv, argv: string[]): ProxyConfig {
  const { values } = parseArgs({
    args: argv,
    options: Object.fromEntries(KEYS.map((k) => [flagOf(k), { type: "string" as const }])),
    strict: true,
  });
  const raw: Record<string, string> = {};
  for (const key of KEYS) {
    const value = (values as Record<string, string | undefined>)[flagOf(key)] ?? env[key];
    if (value !== undefined && value !== "") raw[key] = value;
  }
  const parsed = Schema.safeParse(raw);
  if (!parsed.success) {
    const problems = parsed.error.issues.map((i) => {
      const key = String(i.path[0]);
      const message = raw[key] === undefined && i.code === "invalid_type" ? "is not set" : i.message;
      return `${key} (--${flagOf(key)}): ${message}`;
    });
    throw new ConfigError(`invalid proxy configuration:\n  ${problems.join("\n  ")}`);
  }
  const c = parsed.data;
  const list = (s: string | undefined) =>
    (s ?? "")
      .split(",")
      .map((x) => x.trim())
      .filter(Boolean);
  const testRoutes = new Map<string, { address: string; port: number }>();
  for (const entry of list(c.BW_TEST_ROUTES)) {
    const m = /^([^=]+)=(\[[^\]]+\]|[^:]+):(\d+)$/.exec(entry);
    if (!m) throw new ConfigError(`BW_TEST_ROUTES: entry ${testRoutes.size + 1} is not host=ip:port`);
    testRoutes.set(m[1] as string, { address: (m[2] as string).replace(/^\[|\]$/g, ""), port: Number(m[3]) });
  }
  let extraCaPem: string | undefined = c.BW_TEST_EXTRA_CA_PEM;
  if (c.BW_TEST_EXTRA_CA_FILE) {
    try {
      extraCaPem = readFileSync(c.BW_TEST_EXTRA_CA_FILE, "utf8");
    } catch {
      throw new ConfigError("BW_TEST_EXTRA_CA_FILE: cannot read the file");
    }
  }
  return {
    ...c,
    extraCaPem,
    testRoutes,
    testAllowCidrs: list(c.BW_TEST_ALLOW_CIDRS),
    ownAddresses: list(c.BW_OWN_ADDRESSES),
  };
}
