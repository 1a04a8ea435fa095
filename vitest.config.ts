import { defineConfig } from "vitest/config";
import "./test/setup/receiver-ca.ts";

// The test plugin is imported only now, after test/setup/receiver-ca made the notification
// receiver's CA and named it in NODE_EXTRA_CA_CERTS: Miniflare reads that variable once, when it
// is first loaded, and a static import would load it first (bundled configs hoist them).
const { cloudflareTest } = await import("@cloudflare/vitest-plugin");

// Tests reach only loopback: no Request.cf download from Cloudflare, no telemetry.
process.env.CLOUDFLARE_CF_FETCH_ENABLED = "false";
process.env.WRANGLER_SEND_METRICS = "false";

// Five projects: pure modules and Node-side code run in Node ("unit"); the Worker's routes run
// inside workerd against a real Postgres that test/setup/database.ts starts ("worker"); whole
// runs on the local backend ("e2e"); the `benchwright` CLI as a child process against
// `wrangler dev` over real HTTP ("cli"); the images of proxy-image/, built and run ("images").
//
// Scheduling (CI has 2 cores; vitest's default there is one file at a time): unit, worker, cli
// and images first, two files at once, the unit files one at a time among themselves (some build
// network namespaces and nftables rules of the host); then e2e alone, one file at a time, so whole
// runs with real timeouts never share the machine with another suite.
export default defineConfig({
  test: {
    maxWorkers: 2,
    projects: [
      {
        test: {
          name: "unit",
          include: ["test/unit/**/*.test.ts", "test/proxy/**/*.test.ts", "test/local/**/*.test.ts"],
          environment: "node",
          globalSetup: ["./test/setup/build-proxy.ts", "./test/setup/stale-agents.ts"],
          maxWorkers: 1,
          // Real processes, TLS handshakes and fixtures made at run time: on an idle machine the
          // slowest take 2-4 s, and twice that with both cores busy, past vitest's default 5 s.
          // Nothing here asserts time, so the bound only catches a test that hangs.
          testTimeout: 30_000,
          hookTimeout: 60_000,
        },
      },
      {
        plugins: [
          cloudflareTest(({ inject }) => ({
            main: "./src/index.ts",
            wrangler: { configPath: "./wrangler.toml" },
            miniflare: {
              bindings: {
                DATABASE_URL: inject("databaseUrl"),
                DATABASE_WS_PROXY: inject("databaseWsProxy"),
                VAULT_KEK: inject("vaultKek"),
                // The suite's own receiver is https://127.0.0.1:<port> (src/notifications/target.ts).
                NOTIFICATIONS_ADMIT_LOOPBACK: "true",
              },
              // The per-key limit's test (case K4) floods through this one: the same local
              // limiter as wrangler.toml's API_RATE_LIMIT, at a bound a busy machine reaches
              // within one 10 s window (300 requests there may take longer than the window).
              ratelimits: {
                API_RATE_LIMIT_FLOOD: { namespace_id: "1002", simple: { limit: 20, period: 10 } },
              },
            },
          })),
        ],
        test: {
          name: "worker",
          include: ["test/worker/**/*.test.ts"],
          // Each test drives real Postgres, Durable Objects and alarms in workerd: on an idle 2-core
          // machine a few take 5-8 s, and several times that with both cores busy. Nothing here
          // asserts time, so the bound only catches a test that hangs.
          testTimeout: 60_000,
          globalSetup: [
            "./test/setup/database.ts",
            "./test/setup/contracts.ts",
            "./test/setup/receiver.ts",
            // The real OCI registry (docker-registry with token auth); Node tests start their own.
            "./test/setup/registry.ts",
          ],
          setupFiles: ["./test/setup/zod-openapi.ts"],
        },
      },
      {
        // Whole runs on the local backend: real namespaces, the real host agent, the real proxy
        // and `wrangler dev` serving the Worker. Needs root on Linux; skipped with a message
        // elsewhere. One file at a time: they share the host's network setup.
        test: {
          name: "e2e",
          include: ["test/e2e/**/*.test.ts"],
          environment: "node",
          globalSetup: ["./test/setup/database.ts", "./test/setup/stale-agents.ts"],
          fileParallelism: false,
          sequence: { groupOrder: 1 },
          testTimeout: 120_000,
          hookTimeout: 180_000,
        },
      },
      {
        // The four images built daemonless (npm run images; cached) and their programs run from
        // them. Needs root and buildah; skipped with a message elsewhere, never under CI. It makes
        // no network namespace (buildah's chroot isolation), so it may share the first group.
        test: {
          name: "images",
          include: ["test/images/**/*.test.ts"],
          environment: "node",
          testTimeout: 60_000,
          // A clean machine builds the base and the four images first (about 70 s here; minutes
          // where only vfs storage works).
          hookTimeout: 900_000,
        },
      },
      {
        test: {
          name: "cli",
          include: ["test/cli/**/*.test.ts"],
          environment: "node",
          globalSetup: ["./test/setup/cli-stack.ts"],
          testTimeout: 30_000,
        },
      },
    ],
  },
});
