// The collect program's command (dist/collect.cjs): `node collect.cjs <dir> [--max-bytes N]
// [--max-files N]`. Writes a .tar.gz to stdout: `files/<path>` entries, then `manifest.json` (a
// CollectManifest, the truth about what the archive holds). Exit 0: the archive is complete (a
// missing <dir> is one with `missing: true`); 1: it is not, and stderr says why.
import { Writable } from "node:stream";
import { ARTIFACT_DEFAULTS, COLLECT_EXIT } from "@benchwright/shared/contract/bundle";
import { parseArchiveArgs } from "../common/archive-args";
import { collect } from "./collect";

const args = parseArchiveArgs(process.argv.slice(2), ARTIFACT_DEFAULTS);
if (typeof args === "string") {
  process.stderr.write(`usage: collect.cjs <dir> [--max-bytes N] [--max-files N]: ${args}\n`);
  process.exitCode = COLLECT_EXIT.failed;
} else {
  const out = Writable.toWeb(process.stdout) as WritableStream<Uint8Array>;
  collect(args.dir, { maxBytes: args.maxBytes, maxFiles: args.maxFiles }, out)
    .then(() => {
      process.exitCode = COLLECT_EXIT.ok;
    })
    .catch((e: unknown) => {
      process.stderr.write(`collect failed: ${(e as Error).message}\n`);
      process.exitCode = COLLECT_EXIT.failed;
    });
}
