// Debian bookworm's buildah (1.28) predates Dockerfile heredocs (buildah 1.33): it reads
// `COPY <<'EOF' /dest` as a file named "<<'EOF'". So before such a build, each `COPY <<X dest`
// block becomes a file of the same text and `COPY <that file> dest`, flags kept; the rest of the
// Dockerfile is untouched. Docker and newer buildah build the committed file as it is.
//
// Only COPY heredocs are rewritten (a RUN heredoc would need a shell here, and none is used), one
// per instruction, with a quoted delimiter or with no `$` in the body (Docker expands variables in
// an unquoted one; that is not done here, so it is refused).

export interface Expanded {
  dockerfile: string;
  /** The heredoc bodies, by the context path the rewritten COPY names. */
  files: Map<string, string>;
}

const COPY_HEREDOC = /^(\s*COPY\s+(?:--\S+\s+)*)<<(-?)(["']?)([A-Za-z_][A-Za-z0-9_]*)\3\s+(\S+)\s*$/i;

/** `text` with each COPY heredoc replaced by a copy of `${dir}/<n>`, and those files' text. */
export function expandCopyHeredocs(text: string, dir: string): Expanded {
  const lines = text.split("\n");
  const out: string[] = [];
  const files = new Map<string, string>();
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i] as string;
    const m = COPY_HEREDOC.exec(line);
    if (!m) {
      if (/^\s*(COPY|ADD|RUN)\b.*<<-?["']?[A-Za-z_]/i.test(line)) {
        throw new Error(`line ${i + 1}: a heredoc this rewrite does not handle: ${line.trim()}`);
      }
      out.push(line);
      continue;
    }
    const [, head, dash, quote, delimiter, dest] = m as unknown as [
      string,
      string,
      string,
      string,
      string,
      string,
    ];
    const body: string[] = [];
    let end = i + 1;
    for (; end < lines.length; end++) {
      const l = dash ? (lines[end] as string).replace(/^\t+/, "") : (lines[end] as string);
      if (l === delimiter) break;
      body.push(l);
    }
    if (end === lines.length) throw new Error(`line ${i + 1}: heredoc ${delimiter} is never closed`);
    const content = body.map((l) => `${l}\n`).join("");
    if (!quote && content.includes("$")) {
      throw new Error(`line ${i + 1}: an unquoted heredoc with $ in it (quote its delimiter)`);
    }
    const path = `${dir}/${files.size + 1}`;
    files.set(path, content);
    out.push(`${head}${path} ${dest}`);
    i = end;
  }
  return { dockerfile: out.join("\n"), files };
}
