import { buildPolicyIndex } from "@benchwright/shared/policy/compile";
import { Hono } from "hono";
import { blockedPerDay, listBlockedHosts } from "../../runs/audit-log";
import { listRuns } from "../../runs/service";
import { listHosts } from "../../vault/hosts";
import { listModels } from "../../vault/models";
import { previewPolicy } from "../../vault/policy";
import { listRules } from "../../vault/rules";
import { listSecrets } from "../../vault/secrets";
import type { PageEnv } from "../context";
import { Flash, Layout, readFlash } from "../layout";
import { BLOCKED_CHART_STYLE, BLOCKED_PAGE, BlockedSection, blockedRoutes } from "./blocked";
import { DrySection, dryRunRoutes, RECENT_RUNS } from "./dry-run";
import { type Ctx, PAGE, who } from "./forms";
import { HostsSection, hostsRoutes } from "./hosts";
import { ModelsSection, modelsRoutes } from "./models";
import { RoutingSection } from "./routing";
import { RulesSection, rulesRoutes } from "./rules";
import { SecretsSection, secretsRoutes } from "./secrets";

// The vault page (/manage/vault): routing mode, secrets, rules, host policy, models, recent
// blocked hosts and a dry run of a change, one module a section in this folder, put together
// here. Every form posts to /manage/vault/... and is answered with a 303 back to the page with a
// flash (`?ok=` or `?error=`, the service's own detail; forms.tsx); a refused form keeps its
// input (never a value). The sections call the same service functions as the API (src/vault/,
// src/runs/audit-log.ts), so the page cannot drift from it.

async function vaultPage(c: Ctx): Promise<Response> {
  const p = who(c);
  const db = c.var.db;
  const ring = c.var.config.keyRing;
  const [secrets, rules, hosts, models, doc, blocked, perDay, recent] = await Promise.all([
    listSecrets(db, p),
    listRules(db, p),
    listHosts(db, p),
    listModels(db, p),
    previewPolicy(db, p, { egress: "direct" }),
    listBlockedHosts(db, p, { limit: BLOCKED_PAGE, cursor: c.req.query("blockedCursor") || undefined, ring }),
    blockedPerDay(db, p, new Date()),
    listRuns(db, p, { limit: RECENT_RUNS, ring }),
  ]);
  const index = buildPolicyIndex(doc);
  const usedBy = new Map<string, number[]>();
  for (const [i, r] of rules.entries()) usedBy.set(r.secret, [...(usedBy.get(r.secret) ?? []), i + 1]);
  const csrf = c.var.session.csrf;
  return c.html(
    <Layout title="Vault" csrf={csrf}>
      <style>{BLOCKED_CHART_STYLE}</style>
      <h1>Vault</h1>
      <Flash {...(await readFlash(csrf, (k) => c.req.query(k)))} />
      <RoutingSection doc={doc} csrf={csrf} />
      <SecretsSection c={c} csrf={csrf} secrets={secrets} usedBy={usedBy} />
      <RulesSection c={c} csrf={csrf} rules={rules} secrets={secrets.map((s) => s.name)} />
      <HostsSection c={c} csrf={csrf} hosts={hosts} defaultAction={doc.default} />
      <ModelsSection c={c} csrf={csrf} models={models} secrets={secrets.map((s) => s.name)} />
      <BlockedSection
        c={c}
        csrf={csrf}
        page={blocked}
        days={perDay}
        decide={(h) => index.decideHost(h).action}
      />
      <DrySection c={c} runs={recent.ok ? recent.value.items.map((r) => r.id) : []} />
    </Layout>,
  );
}

export const vaultPageRoutes = new Hono<PageEnv>()
  .get(PAGE, vaultPage)
  .route("/", modelsRoutes)
  .route("/", blockedRoutes)
  .route("/", secretsRoutes)
  .route("/", rulesRoutes)
  .route("/", hostsRoutes)
  .route("/", dryRunRoutes);
