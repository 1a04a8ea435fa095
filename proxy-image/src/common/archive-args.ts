// The command line bw-unpack and bw-collect share: `<dir> [--max-bytes N] [--max-files N]`.
// A bound left out is the contract's default; a bad one is an error, never a silent default.

export interface ArchiveArgs {
  dir: string;
  maxBytes: number;
  maxFiles: number;
}

export function parseArchiveArgs(
  argv: readonly string[],
  defaults: { maxBytes: number; maxFiles: number },
): ArchiveArgs | string {
  let dir: string | null = null;
  let { maxBytes, maxFiles } = defaults;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string;
    if (arg === "--max-bytes" || arg === "--max-files") {
      const value = argv[++i];
      if (value === undefined || !/^\d{1,15}$/.test(value))
        return `${arg}: a whole number of at most 15 digits`;
      if (arg === "--max-bytes") maxBytes = Number(value);
      else maxFiles = Number(value);
    } else if (arg.startsWith("-") || dir !== null) {
      return `unexpected argument ${JSON.stringify(arg)}`;
    } else {
      dir = arg;
    }
  }
  if (dir === null || dir === "") return "the directory is missing";
  return { dir, maxBytes, maxFiles };
}
