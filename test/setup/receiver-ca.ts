import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createTestCa } from "../../scripts/lib/test-ca.ts";

// Imported by vitest.config.ts before it loads the test plugin, for its side effect: a throwaway
// CA and a certificate for 127.0.0.1, for the suite's notification receiver
// (test/fixtures/notification-receiver.ts), and NODE_EXTRA_CA_CERTS naming the CA, so workerd
// trusts that receiver as it trusts a real one. Miniflare reads NODE_EXTRA_CA_CERTS once, when
// it is first loaded. The config is evaluated more than once (and child processes inherit the
// environment), so a CA already made is reused: a second one would sign a certificate the
// first-loaded Miniflare does not trust. An earlier NODE_EXTRA_CA_CERTS is kept in the bundle.

async function prepare(): Promise<void> {
  const made = process.env.BW_TEST_RECEIVER_TLS;
  if (made && existsSync(join(made, "leaf.pem"))) return;
  const dir = mkdtempSync(join(tmpdir(), "bw-receiver-ca-"));
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  const ca = await createTestCa("Benchwright test notification receiver CA");
  const leaf = await ca.issue(["127.0.0.1"]);
  let bundle = ca.certPem;
  const earlier = process.env.NODE_EXTRA_CA_CERTS;
  if (earlier) {
    try {
      bundle = `${readFileSync(earlier, "utf8")}\n${bundle}`;
    } catch {
      // An unreadable file trusted nothing before either.
    }
  }
  writeFileSync(join(dir, "ca.pem"), bundle);
  writeFileSync(join(dir, "leaf.pem"), leaf.certPem);
  writeFileSync(join(dir, "leaf-key.pem"), leaf.keyPem, { mode: 0o600 });
  process.env.NODE_EXTRA_CA_CERTS = join(dir, "ca.pem");
  /** Where test/setup/receiver.ts finds the receiver's certificate and key. */
  process.env.BW_TEST_RECEIVER_TLS = dir;
}

await prepare();
