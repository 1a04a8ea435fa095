import { bugReportsCreate, bugReportsList } from "../commands/bug-reports";
import * as models from "../commands/models";
import * as notifications from "../commands/notifications";
import { setupImagesDelete, setupImagesList } from "../commands/setup-images";
import {
  webhooksCreate,
  webhooksDelete,
  webhooksList,
  webhooksRotate,
  webhooksShow,
} from "../commands/webhooks";
import { type CommandTable, none, type Options, one, page, pageOf, str, type Values } from "../registry";

// Webhooks, notification URLs, the vault's models and bug reports.

const modelFlags: Options = {
  provider: { type: "string" },
  "base-url": { type: "string" },
  "upstream-model": { type: "string" },
  secret: { type: "string" },
};
const modelFields = (v: Values): models.ModelFields => ({
  provider: str(v, "provider"),
  baseUrl: str(v, "base-url"),
  upstreamModel: str(v, "upstream-model"),
  secret: str(v, "secret"),
});

export const MORE_COMMANDS: CommandTable = {
  "webhooks create": {
    usage: "benchwright webhooks create NAME --from SPEC.json --secret-out PATH",
    summary: "register a webhook: each signed delivery to its URL starts the run SPEC.json describes",
    help:
      "SPEC.json is a run spec as POST /v1/runs takes it. The signing secret (whsec_...) is shown by the\n" +
      "API only once: it is written to PATH (a new file, mode 0600), never printed.",
    options: { from: { type: "string" }, "secret-out": { type: "string" } },
    run: (ctx, v, p) =>
      webhooksCreate(ctx, one(p, "webhook name"), { from: str(v, "from"), secretOut: str(v, "secret-out") }),
  },
  "webhooks list": {
    usage: "benchwright webhooks list",
    summary: "webhooks, newest first (never their secrets)",
    run: async (ctx, _v, p) => {
      none(p, "webhooks list");
      await webhooksList(ctx);
    },
  },
  "webhooks show": {
    usage: "benchwright webhooks show WEBHOOK_ID",
    summary: "a webhook's URL, dates and run spec",
    run: (ctx, _v, p) => webhooksShow(ctx, one(p, "webhook id")),
  },
  "webhooks delete": {
    usage: "benchwright webhooks delete WEBHOOK_ID",
    summary: "revoke a webhook: later deliveries are refused",
    run: (ctx, _v, p) => webhooksDelete(ctx, one(p, "webhook id")),
  },
  "webhooks rotate-secret": {
    usage: "benchwright webhooks rotate-secret WEBHOOK_ID --secret-out PATH",
    summary: "a new signing secret, written to PATH (the old one verifies for 24 more hours)",
    options: { "secret-out": { type: "string" } },
    run: (ctx, v, p) => webhooksRotate(ctx, one(p, "webhook id"), { secretOut: str(v, "secret-out") }),
  },
  "notifications create": {
    usage: "benchwright notifications create URL --secret-out PATH",
    summary: "be told at URL (https) when a run of this environment ends: a signed POST per run",
    help:
      "Deliveries are Standard Webhooks requests; verify them with the signing secret (whsec_...), which\n" +
      "the API shows only once: it is written to PATH (a new file, mode 0600), never printed.",
    options: { "secret-out": { type: "string" } },
    run: (ctx, v, p) =>
      notifications.notificationsCreate(ctx, one(p, "URL"), { secretOut: str(v, "secret-out") }),
  },
  "notifications list": {
    usage: "benchwright notifications list [--limit N] [--cursor C]",
    summary: "notification URLs, newest first (never their secrets)",
    options: page,
    run: async (ctx, v, p) => {
      none(p, "notifications list");
      await notifications.notificationsList(ctx, pageOf(v));
    },
  },
  "notifications deliveries": {
    usage: "benchwright notifications deliveries NOTIFICATION_ID [--limit N] [--cursor C]",
    summary: "what was sent to a notification URL, each with its attempts and how the last went",
    options: page,
    run: (ctx, v, p) => notifications.notificationsDeliveries(ctx, one(p, "notification id"), pageOf(v)),
  },
  "notifications delete": {
    usage: "benchwright notifications delete NOTIFICATION_ID",
    summary: "revoke a notification URL: nothing more is sent, pending deliveries are cancelled",
    run: (ctx, _v, p) => notifications.notificationsDelete(ctx, one(p, "notification id")),
  },
  "vault models list": {
    usage: "benchwright vault models list",
    summary: "the models runs may declare, with their provider and the secret they call it with",
    run: async (ctx, _v, p) => {
      none(p, "vault models list");
      await models.modelsList(ctx);
    },
  },
  "vault models add": {
    usage:
      "benchwright vault models add NAME --provider P --secret SECRET_NAME [--base-url URL] [--upstream-model M]",
    summary: "add a model a run may declare (its key is a vault secret, named, never shown)",
    help:
      "The fields go to POST /v1/vault/models as given (--base-url as baseUrl, ...); the API says which\n" +
      "providers it knows and when a base URL is needed. --upstream-model defaults to NAME.",
    options: modelFlags,
    run: (ctx, v, p) => models.modelsAdd(ctx, one(p, "model name"), modelFields(v)),
  },
  "vault models show": {
    usage: "benchwright vault models show MODEL_ID|NAME",
    summary: "one model",
    run: (ctx, _v, p) => models.modelsShow(ctx, one(p, "model id or name")),
  },
  "vault models update": {
    usage:
      "benchwright vault models update MODEL_ID|NAME [--name N] [--provider P] [--base-url URL] [--upstream-model M] [--secret S]",
    summary: "change a model's fields (only those given)",
    options: { ...modelFlags, name: { type: "string" } },
    run: (ctx, v, p) =>
      models.modelsUpdate(ctx, one(p, "model id or name"), { ...modelFields(v), name: str(v, "name") }),
  },
  "vault models remove": {
    usage: "benchwright vault models remove MODEL_ID|NAME",
    summary: "delete a model (runs can no longer declare it)",
    run: (ctx, _v, p) => models.modelsRemove(ctx, one(p, "model id or name")),
  },
  "bug-reports create": {
    usage: "benchwright bug-reports create RUN_ID --title TITLE [--body TEXT | --body-file PATH]",
    summary: "report a bug on one of your runs (it joins the run's trace)",
    help: "The body is --body, else --body-file, else standard input when piped.",
    options: { title: { type: "string" }, body: { type: "string" }, "body-file": { type: "string" } },
    run: (ctx, v, p) =>
      bugReportsCreate(ctx, one(p, "run id"), {
        title: str(v, "title"),
        body: str(v, "body"),
        bodyFile: str(v, "body-file"),
      }),
  },
  "bug-reports list": {
    usage: "benchwright bug-reports list RUN_ID [--limit N] [--cursor C]",
    summary: "a run's bug reports, newest first",
    options: page,
    run: (ctx, v, p) => bugReportsList(ctx, one(p, "run id"), pageOf(v)),
  },
  "setup-images list": {
    usage: "benchwright setup-images list [--limit N] [--cursor C]",
    summary: "the setup images this environment keeps, most recently used first",
    help:
      "A run's setup commands run once per distinct setup; later sandboxes and runs with the same key\n" +
      "(base image, bundle, setup commands, memory and pids) start from the kept image.",
    options: page,
    run: async (ctx, v, p) => {
      none(p, "setup-images list");
      await setupImagesList(ctx, pageOf(v));
    },
  },
  "setup-images delete": {
    usage: "benchwright setup-images delete KEY",
    summary: "drop a setup image (the full 64-hex key): the next run with that setup builds it again",
    run: (ctx, _v, p) => setupImagesDelete(ctx, one(p, "setup image key")),
  },
};
