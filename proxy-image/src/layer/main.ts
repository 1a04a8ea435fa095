// The layer program's command (dist/layer.cjs, /bw/tools/bin/bw-layer in a sandbox0 pod):
// `node layer.cjs <dir> [--max-bytes N] [--max-files N]`. Writes the tar of <dir> to stdout
// (layer.ts). Exit codes: LAYER_EXIT (shared/contract/setup-image.ts); stderr says why.
import { Writable } from "node:stream";
import { LAYER_EXIT } from "@benchwright/shared/contract/setup-image";
import { parseArchiveArgs } from "../common/archive-args";
import { LayerStop, packLayer } from "./layer";

/** Without bounds on the command line: SETUP_IMAGE_MAX_LAYER_MB's default, and a venv's worth of files. */
const DEFAULTS = { maxBytes: 2048 * 1024 * 1024, maxFiles: 500_000 };

const args = parseArchiveArgs(process.argv.slice(2), DEFAULTS);
if (typeof args === "string") {
  process.stderr.write(`usage: layer.cjs <dir> [--max-bytes N] [--max-files N]: ${args}\n`);
  process.exitCode = LAYER_EXIT.failed;
} else {
  const out = Writable.toWeb(process.stdout) as WritableStream<Uint8Array>;
  packLayer(args.dir, { maxBytes: args.maxBytes, maxFiles: args.maxFiles }, out)
    .then(() => {
      process.exitCode = LAYER_EXIT.ok;
    })
    .catch((e: unknown) => {
      process.stderr.write(`layer: ${(e as Error).message}\n`);
      process.exitCode =
        e instanceof LayerStop
          ? e.why === "refused"
            ? LAYER_EXIT.refused
            : LAYER_EXIT.tooLarge
          : LAYER_EXIT.failed;
    });
}
