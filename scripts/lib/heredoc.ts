import { readInstructions } from "./dockerfile";

// Debian bookworm's buildah (1.28) predates Dockerfile heredocs (buildah 1.33): it reads
// `COPY <<'EOF' /dest` as a file named "<<'EOF'". So before such a build, each `COPY <<X dest`
// block becomes a file of the same text and `COPY <that file> dest`, flags kept; the rest of the
// Dockerfile is untouched. Docker and newer buildah build the committed file as it is.
//
// Only COPY heredocs are rewritten (a RUN heredoc would need a shell here, and none is used), one
// per instruction, with a quoted delimiter or with no `$` in the body (Docker expands variables in
// an unquoted one; that is not done here, so it is refused). The Dockerfile is read by the same
// reader as the E2B translation's (dockerfile.ts).

export interface Expanded {
  dockerfile: string;
  /** The heredoc bodies, by the context path the rewritten COPY names. */
  files: Map<string, string>;
}

const COPY_HEREDOC = /^<<-?["']?[A-Za-z_][A-Za-z0-9_]*["']?\s+(\S+)$/;

/** `text` with each COPY heredoc replaced by a copy of `${dir}/<n>`, and those files' text. */
export function expandCopyHeredocs(text: string, dir: string): Expanded {
  const lines = text.split("\n");
  const out: string[] = [];
  const files = new Map<string, string>();
  let next = 0; // the first line of `lines` not yet in `out`
  for (const ins of readInstructions(text)) {
    if (ins.heredocs.length === 0) continue;
    const heredoc = ins.heredocs[0];
    const dest = COPY_HEREDOC.exec(ins.text)?.[1];
    if (ins.keyword !== "COPY" || ins.heredocs.length > 1 || !heredoc || !dest) {
      throw new Error(
        `line ${ins.line}: a heredoc this rewrite does not handle: ${lines[ins.line - 1]?.trim()}`,
      );
    }
    if (!heredoc.quoted && heredoc.body.includes("$")) {
      throw new Error(`line ${ins.line}: an unquoted heredoc with $ in it (quote its delimiter)`);
    }
    const path = `${dir}/${files.size + 1}`;
    files.set(path, heredoc.body);
    const flags = ins.flags.map(([name, value]) => (value ? `--${name}=${value} ` : `--${name} `)).join("");
    out.push(...lines.slice(next, ins.line - 1), `COPY ${flags}${path} ${dest}`);
    next = ins.endLine;
  }
  out.push(...lines.slice(next));
  return { dockerfile: out.join("\n"), files };
}
