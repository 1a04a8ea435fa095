import { isCanonicalIp } from "@benchwright/shared/contract/host-name";
import type { PolicyDocument, PolicyRouting, RoutingReason } from "@benchwright/shared/contract/policy";
import { PAGE } from "./forms";
import { ButtonForm, Section } from "./section";

// The vault page's routing mode: what a run started now gets (the compiled policy,
// src/vault/policy.ts), why, and what catch-all routing costs (also said by the dry run).

const REASONS: Record<RoutingReason, string> = {
  block_default:
    "The default is block: a host no entry allows is refused, so every connection must reach the proxy.",
  wildcard_block: "A wildcard block entry: a hosts file can only redirect exact names.",
  wildcard_rule: "A rule for a wildcard host: a hosts file can only redirect exact names.",
  ip_literal: "An entry or rule names an IP address: connections to an IP never look at the hosts file.",
  local_egress: "The run egresses through your own machine.",
  wildcard_limit:
    "A wildcard allowed host has method or path limits: a hosts file can only redirect exact names.",
  tunnel_host:
    "A host is routed through your own machine (via tunnel): only catch-all routing brings its traffic to the proxy and the tunnel.",
};

/** The entries behind a reason, so the user sees what to change. */
function culprits(doc: PolicyDocument, reason: RoutingReason): string[] {
  const blocks = doc.hosts.filter((h) => h.action === "block").map((h) => h.pattern);
  const rules = doc.rules.map((r) => r.host);
  switch (reason) {
    case "wildcard_block":
      return blocks.filter((p) => p.startsWith("*."));
    case "wildcard_rule":
      return rules.filter((p) => p.startsWith("*."));
    case "ip_literal":
      return [...new Set([...blocks, ...rules].filter(isCanonicalIp))];
    case "wildcard_limit":
      return doc.hosts
        .filter(
          (h) =>
            h.action === "allow" && h.pattern.startsWith("*.") && (h.methods !== null || h.paths !== null),
        )
        .map((h) => h.pattern);
    case "tunnel_host":
      return doc.hosts.filter((h) => h.via === "tunnel").map((h) => h.pattern);
    default:
      return [];
  }
}

/** The plain warning of what catch-all routing costs (the vault page and the dry run). */
export function CatchAllCosts(props: { blockDefault: boolean; csrf: string; title?: string }) {
  return (
    <div class="warning">
      <p>
        <strong>{props.title ?? "What catch-all costs:"}</strong>
      </p>
      <ul>
        <li>Runs are slower: every connection goes through the proxy, not only the ones it acts on.</li>
        {props.blockDefault ? (
          <li>
            Package and source hosts (npm, PyPI, GitHub, Debian, ...) must be allowed, or installs fail.{" "}
            <ButtonForm
              action={`${PAGE}/starter-pack`}
              csrf={props.csrf}
              label="Allow the starter pack"
              inline
            />
          </li>
        ) : null}
        <li>
          A run stops, before any benchmark code runs, if the redirect cannot be installed in its sandbox.
        </li>
      </ul>
    </div>
  );
}

export function RoutingSection(props: { doc: PolicyDocument; csrf: string }) {
  const { doc } = props;
  const catchAll = doc.routing.mode === "catch-all";
  return (
    <Section id="routing" title="Routing mode">
      <p>
        A run started now gets <strong>{catchAll ? "catch-all" : "default"}</strong> routing
        <span class="muted">{` (vault version ${doc.version})`}</span>.{" "}
        {catchAll
          ? "Every outbound connection on ports 80 and 443 goes to the run's proxy, which is its only way out."
          : "Only the hosts the vault names exactly (rules and block entries) are sent to the proxy, through the sandbox's hosts file; everything else goes direct. On the local backend the proxy also sees every other connection on ports 80 and 443 and refuses a blocked name there, but a block does not stop code that sends another name to a blocked host's address, nor other ports; on sandbox0 and E2B it holds only for code that uses the hosts file."}
      </p>
      {doc.routing.reasons.length > 0 ? (
        <>
          <p>Why catch-all:</p>
          <ul>
            {doc.routing.reasons.map((r) => {
              const which = culprits(doc, r);
              return (
                <li>
                  {REASONS[r]}
                  {which.length > 0 ? (
                    <>
                      {" "}
                      {which.slice(0, 10).map((w, i) => (
                        <>
                          {i > 0 ? ", " : ""}
                          <code>{w}</code>
                        </>
                      ))}
                      {which.length > 10 ? ` and ${which.length - 10} more` : ""}
                    </>
                  ) : null}
                </li>
              );
            })}
          </ul>
        </>
      ) : null}
      {catchAll ? <CatchAllCosts blockDefault={doc.default === "block"} csrf={props.csrf} /> : null}
      <p class="muted">A run that egresses through your own machine always gets catch-all routing.</p>
      {doc.note ? <p class="note">{doc.note}</p> : null}
    </Section>
  );
}

export function RoutingLine(props: { routing: PolicyRouting }) {
  const { mode, reasons } = props.routing;
  return (
    <>
      <strong>{mode}</strong>
      {reasons.length > 0 ? ` (${reasons.map((r) => REASONS[r].replace(/[:.].*$/, "")).join("; ")})` : ""}
    </>
  );
}
