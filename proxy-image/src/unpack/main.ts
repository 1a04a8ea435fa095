// The unpack program's command (dist/unpack.cjs): `node unpack.cjs <dir> [--max-bytes N]
// [--max-files N]` with a bundle's .tar.gz on stdin. Prints one UnpackResult line on stdout; exit
// 0 unpacked, 2 refused (the result's code and message say why). Exit 1: it could not run (an
// argument, <dir>, the disk, a file already there): a message on stderr, nothing on stdout.
import { Readable } from "node:stream";
import { BUNDLE_DEFAULTS, UNPACK_EXIT } from "@benchwright/shared/contract/bundle";
import { parseArchiveArgs } from "../common/archive-args";
import { unpack } from "./unpack";

const args = parseArchiveArgs(process.argv.slice(2), {
  maxBytes: BUNDLE_DEFAULTS.maxUnpackedBytes,
  maxFiles: BUNDLE_DEFAULTS.maxFiles,
});
if (typeof args === "string") {
  process.stderr.write(`usage: unpack.cjs <dir> [--max-bytes N] [--max-files N]: ${args}\n`);
  process.exitCode = UNPACK_EXIT.failed;
} else {
  const input = Readable.toWeb(process.stdin) as ReadableStream<Uint8Array>;
  unpack(args.dir, input, { maxUnpackedBytes: args.maxBytes, maxFiles: args.maxFiles })
    .then((result) => {
      process.stdout.write(`${JSON.stringify(result)}\n`);
      process.exitCode = result.ok ? UNPACK_EXIT.ok : UNPACK_EXIT.refused;
    })
    .catch((e: unknown) => {
      process.stderr.write(`unpack failed: ${(e as Error).message}\n`);
      process.exitCode = UNPACK_EXIT.failed;
    });
}
