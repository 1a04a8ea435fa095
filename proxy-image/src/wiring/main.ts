// The wiring program's command (dist/wiring.cjs): `node wiring.cjs < input.json`, or
// `node wiring.cjs reinstall < reinstall.json` (shared/contract/wiring.ts: WiringReinstall). Reads one
// WiringInput (shared/contract/wiring.ts) on stdin, prints one WiringProof on stdout. Exit 0: wired
// and proven; 1: a probe (or writing the files) failed, the proof says which; 2: bad input, a
// message on stderr names the field, nothing on stdout.
import { WIRING_EXIT } from "@benchwright/shared/contract/wiring";
import { reinstall, wireFromText } from "./wiring";

const MAX_INPUT_BYTES = 1024 * 1024;

async function readStdin(): Promise<string | null> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of process.stdin) {
    size += (chunk as Buffer).length;
    if (size > MAX_INPUT_BYTES) return null;
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString("utf8");
}

const reinstalling = process.argv[2] === "reinstall";

readStdin()
  .then(async (text) => {
    if (reinstalling) {
      let json: unknown = null;
      try {
        json = JSON.parse(text ?? "");
      } catch {}
      const done = reinstall(json);
      if (done.error) process.stderr.write(`${done.error}\n`);
      if (done.result) process.stdout.write(`${JSON.stringify(done.result)}\n`);
      process.exitCode = done.code;
      return;
    }
    const result =
      text === null
        ? { code: WIRING_EXIT.badInput, proof: null, error: "bad wiring input: (stdin): larger than 1 MiB" }
        : await wireFromText(text);
    if (result.error) process.stderr.write(`${result.error}\n`);
    if (result.proof) process.stdout.write(`${JSON.stringify(result.proof)}\n`);
    process.exitCode = result.code;
  })
  .catch((e: unknown) => {
    process.stderr.write(`wiring failed: ${(e as Error).message}\n`);
    process.exitCode = WIRING_EXIT.probeFailed;
  });
