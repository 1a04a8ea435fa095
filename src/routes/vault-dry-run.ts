import { HostAction, InjectSpec, PolicyRouting } from "@benchwright/shared/contract/policy";
import { createRoute, z } from "@hono/zod-openapi";
import { unwrap } from "../errors";
import { jsonBody, jsonOk, newRouter, problems } from "../router";
import * as dry from "../vault/dry-run";
import { HostPatternInput, MethodsInput, PathsInput, ViaInput } from "./vault-hosts";
import { RuleExtras } from "./vault-rules";
import { SecretName } from "./vault-secrets";

// Dry run: what a run's hosts would meet under a draft vault, next to what they meet now. The
// same compile and host decisions as the proxy's; rules named by index and secret name only.

const MAX_ITEMS = 10_000;

const HostEntryInput = z
  .object({
    pattern: HostPatternInput,
    action: HostAction,
    via: ViaInput.optional(),
    methods: MethodsInput.optional(),
    paths: PathsInput.optional(),
  })
  .strict();
const RuleInput = z
  .object({
    host: HostPatternInput.openapi({ example: "api.openrouter.ai" }),
    secret: SecretName,
    inject: InjectSpec,
    ...RuleExtras,
  })
  .strict();

const Draft = z
  .object({
    default: HostAction,
    hosts: z.array(HostEntryInput).max(MAX_ITEMS),
    rules: z.array(RuleInput).max(MAX_ITEMS).openapi({ description: "In order; the first match wins" }),
  })
  .strict()
  .openapi({
    description: "A whole vault; a rule's host without an entry gets an allow entry, as in the vault",
  });

const Changes = z
  .object({
    default: HostAction.optional(),
    hosts: z
      .object({
        upsert: z.array(HostEntryInput).max(MAX_ITEMS).optional(),
        remove: z.array(HostPatternInput).max(MAX_ITEMS).optional(),
      })
      .strict()
      .optional(),
    rules: z
      .object({
        add: z.array(RuleInput).max(MAX_ITEMS).optional().openapi({ description: "Appended, in order" }),
        remove: z
          .array(z.number().int().min(0))
          .max(MAX_ITEMS)
          .optional()
          .openapi({ description: "Indexes in the current order (policy-preview's rules[].index)" }),
      })
      .strict()
      .optional(),
  })
  .strict()
  .openapi({ description: "Edits of the current vault: rules removed, then added, then host entries" });

const Body = z
  .object({
    runId: z.string().min(1).max(64).openapi({ example: "run_0123456789abcdef" }),
    draft: Draft.optional(),
    changes: Changes.optional(),
  })
  .strict()
  .refine((b) => (b.draft === undefined) !== (b.changes === undefined), {
    message: "give exactly one of draft and changes",
  });

const Outcome = z
  .object({
    action: HostAction,
    rule: z
      .number()
      .int()
      .nullable()
      .openapi({ description: "Index of the rule whose secret would be injected, in that vault's order" }),
    route: z.enum(["direct", "tunnel"]).openapi({
      description: "How the host's traffic would leave: the deciding entry's via, else the run's egress",
    }),
    methods: z
      .array(z.string())
      .nullable()
      .openapi({ description: "The deciding host entry's method limit; null: none" }),
    paths: z
      .array(z.string())
      .nullable()
      .openapi({ description: "The deciding host entry's path limit; null: none" }),
  })
  .strict();

const RuleView = z
  .object({
    index: z.number().int(),
    host: z.string(),
    secret: z.string(),
    placeholderEnv: z.string().nullable(),
    placeholderIn: z.array(z.string()),
    methods: z.array(z.string()).nullable(),
    paths: z.array(z.string()).nullable(),
  })
  .strict();

const Placeholder = z
  .object({ env: z.string(), secret: z.string() })
  .strict()
  .openapi({ description: "A variable the run's sandboxes get, holding the secret's placeholder" });

const DryRunResult = z
  .object({
    runId: z.string(),
    hosts: z
      .array(z.object({ host: z.string(), draft: Outcome, current: Outcome, changed: z.boolean() }).strict())
      .openapi({ description: `Changed hosts first, then by name; at most ${dry.MAX_DRY_RUN_HOSTS}` }),
    routing: z.object({ draft: PolicyRouting, current: PolicyRouting }).strict(),
    rules: z
      .object({ draft: z.array(RuleView), current: z.array(RuleView) })
      .strict()
      .openapi({ description: "Each vault's rules in order, with their limits and placeholder variables" }),
    placeholders: z
      .object({ draft: z.array(Placeholder), current: z.array(Placeholder) })
      .strict()
      .openapi({
        description:
          "The placeholder variables the run's sandboxes would get; under a declared model, its lane's own variables win",
      }),
    counts: z.object({ hosts: z.number().int(), changed: z.number().int() }).strict(),
    truncated: z.boolean(),
  })
  .strict()
  .openapi("DryRun");

export const dryRunRoutes = newRouter().openapi(
  createRoute({
    method: "post",
    path: "/dry-run",
    tags: ["vault"],
    operationId: "dryRunVault",
    summary: "Replay a run's hosts against a draft vault (or edits of this one) and against the vault now",
    request: jsonBody(Body),
    responses: { 200: jsonOk(DryRunResult), ...problems(400, 401, 404, 409) },
  }),
  async (c) => c.json(unwrap(await dry.dryRun(c.var.db, c.var.principal, c.req.valid("json"))), 200),
);
