import { wiredHosts } from "@benchwright/shared/policy/hosts-file";
import { AsnConvert } from "@peculiar/asn1-schema";
import {
  GeneralName,
  GeneralSubtree,
  GeneralSubtrees,
  id_ce_nameConstraints,
  NameConstraints,
} from "@peculiar/asn1-x509";
import * as x509 from "@peculiar/x509";
import type { PolicyState } from "./policy-client";

// The run CA's name constraints (case N5). Under default routing the proxy terminates TLS only for
// the names the hosts file sends it (the policy's exact rule, block and limited hosts) and the
// platform's own (probe, model lane), so the CA is made to vouch for those alone: a client then
// refuses a leaf the CA signs for any other name, whoever got the key to sign it. Under catch-all
// every name reaches the proxy and must get a readable 403 over TLS, so there is no constraint.
//
// A dNSName constraint permits the name and every name under it (RFC 5280 4.2.1.10): the proxy
// itself mints only for the exact names (`permits` in ca.ts). Every IP address is excluded, or an
// iPAddress SAN would pass: permitted subtrees constrain only the name types they list.

/** The names a CA made now may vouch for, or null for any name (catch-all, or no policy yet). */
export function terminableNames(state: PolicyState): string[] | null {
  if (state.kind !== "ready" || state.policy.routing.mode !== "default") return null;
  return wiredHosts("default", state.policy.hostsFile).sort();
}

/** A critical NameConstraints extension: DNS names `permitted` (and below), no IP address. */
export function nameConstraintsExtension(permitted: readonly string[]): x509.Extension {
  const subtree = (base: GeneralName) => new GeneralSubtree({ base });
  const value = new NameConstraints({
    permittedSubtrees: new GeneralSubtrees(permitted.map((dNSName) => subtree(new GeneralName({ dNSName })))),
    excludedSubtrees: new GeneralSubtrees([
      subtree(new GeneralName({ iPAddress: "0.0.0.0/0" })),
      subtree(new GeneralName({ iPAddress: "::/0" })),
    ]),
  });
  return new x509.Extension(id_ce_nameConstraints, true, AsnConvert.serialize(value));
}
