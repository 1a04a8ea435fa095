import { type SetupImageInputs, setupImageKey } from "@benchwright/shared/contract/setup-image";
import { randomId } from "../../src/crypto/api-keys";
import { setupImages } from "../../src/db/schema";
import type { Q } from "../../src/db/types";

// Setup image rows for route and reaper tests, written straight to the table (only the broker
// writes them in a run; what is tested here is what the API and the reaper do with them).

type Row = typeof setupImages.$inferInsert;

/** A digest of sha256's shape, unique per call. */
export function newDigest(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(32));
  return `sha256:${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/**
 * A `built` row of the environment (unless `fields` says otherwise) whose setup names `tag`, its
 * key computed from its inputs as the broker computes it.
 */
export async function plantSetupImage(
  db: Q,
  environmentId: string,
  tag: string,
  fields: Partial<Row> = {},
): Promise<Row & { id: string; key: string }> {
  const inputs: SetupImageInputs = {
    format: 1,
    backend: "local",
    base: "sha256:0000000000000000000000000000000000000000000000000000000000000000",
    bundle: null,
    setup: [`pip install ${tag}`],
    resources: { memoryMb: 1024, pids: 512 },
  };
  const row = {
    id: randomId("simg_"),
    environmentId,
    key: await setupImageKey(inputs),
    status: "built",
    backend: "local",
    inputs,
    digest: newDigest(),
    sizeBytes: 4096,
    files: 3,
    builtAt: new Date(),
    ...fields,
  } satisfies Row;
  await db.insert(setupImages).values(row);
  return row;
}
