import { readFileSync } from "node:fs";
import type { Schemas } from "../api";
import { writeSecretFile } from "../io";
import { api, type Ctx, print, secretOf, secretTarget, table, UsageError, withoutSecret } from "./shared";

// `benchwright webhooks ...`: webhooks that start a run per signed delivery (POST /v1/webhooks).
// The signing secret is shown by the API once; the CLI writes it to a file of the user's (0600,
// never an existing one) and never prints it, so it stays out of terminals, logs and CI output.

type Webhook = Schemas["Webhook"];

function readSpec(path: string | undefined): Schemas["RunSpec"] {
  if (!path) throw new UsageError("--from FILE.json is required: the run spec each delivery starts");
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new UsageError(`cannot read ${path}: ${(error as NodeJS.ErrnoException).code ?? error}`);
  }
  try {
    return JSON.parse(text) as Schemas["RunSpec"];
  } catch {
    throw new UsageError(`${path} is not JSON (a run spec, as POST /v1/runs takes it)`);
  }
}

function describe(w: Webhook): string[] {
  return [
    `${w.id}  ${w.name}`,
    `url        ${w.url}`,
    `created    ${w.createdAt}`,
    ...(w.rotatedAt ? [`rotated    ${w.rotatedAt}`] : []),
    ...(w.previousSecretExpiresAt ? [`old secret verifies until ${w.previousSecretExpiresAt}`] : []),
  ];
}

export async function webhooksCreate(
  ctx: Ctx,
  name: string,
  opts: { from?: string; secretOut?: string },
): Promise<void> {
  const out = secretTarget(opts.secretOut);
  const run = readSpec(opts.from);
  const client = api(ctx);
  const made = await client.call("post", "/v1/webhooks", { body: { name, run } });
  writeSecretFile(out, secretOf(made, "rotate it (benchwright webhooks rotate-secret)"));
  print(ctx, withoutSecret(made, out), () => [
    ...describe(made),
    `signing secret written to ${out} (shown only this once; senders sign with it)`,
  ]);
}

export async function webhooksList(ctx: Ctx): Promise<void> {
  const res = await api(ctx).call("get", "/v1/webhooks");
  print(ctx, res, () =>
    res.webhooks.length === 0
      ? ["no webhooks"]
      : table([
          ["ID", "NAME", "URL", "CREATED"],
          ...res.webhooks.map((w) => [w.id, w.name, w.url, w.createdAt]),
        ]),
  );
}

export async function webhooksShow(ctx: Ctx, id: string): Promise<void> {
  const w = await api(ctx).call("get", "/v1/webhooks/{id}", { params: { id } });
  print(ctx, w, () => [...describe(w), "run:", ...JSON.stringify(w.run, null, 2).split("\n")]);
}

export async function webhooksDelete(ctx: Ctx, id: string): Promise<void> {
  await api(ctx).call("delete", "/v1/webhooks/{id}", { params: { id } });
  print(ctx, { id, deleted: true }, () => [`deleted ${id}: later deliveries to it are refused`]);
}

export async function webhooksRotate(ctx: Ctx, id: string, opts: { secretOut?: string }): Promise<void> {
  const out = secretTarget(opts.secretOut);
  const rotated = await api(ctx).call("post", "/v1/webhooks/{id}/rotate-secret", {
    params: { id },
    body: {},
  });
  writeSecretFile(out, secretOf(rotated, "rotate it again"));
  print(ctx, withoutSecret(rotated, out), () => [
    ...describe(rotated),
    `new signing secret written to ${out} (the previous one keeps verifying for 24 hours)`,
  ]);
}
