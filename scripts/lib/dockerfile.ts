// The few parts of Dockerfile syntax the committed Dockerfiles use, read as Docker reads them:
// comments and parser directives, line continuations, heredocs (`<<'EOF'`), `--flag=value`
// flags, stages (`FROM image AS name`) and the global ARGs before the first FROM. Anything else
// is an error, not a guess: this feeds the E2B template translation (e2b-templates.ts), where
// a misread line would be a template that differs from the image Docker builds.

export interface Instruction {
  keyword: string;
  /** `--name=value` flags, in order. */
  flags: Array<[string, string]>;
  /** The rest of the instruction, line continuations removed, otherwise verbatim. */
  text: string;
  /** The bodies of its heredocs, in the order they are named; `quoted`: its delimiter was. */
  heredocs: Array<{ name: string; body: string; quoted: boolean }>;
  /** Its first and last line (1-based), heredoc bodies included. */
  line: number;
  endLine: number;
}

export interface Stage {
  from: string;
  name: string | null;
  instructions: Instruction[];
}

export interface Dockerfile {
  /** Global ARGs (before the first FROM) with their defaults. */
  args: Map<string, string>;
  stages: Stage[];
}

const FLAG = /^--([a-z-]+)(?:=(\S+))?\s+/;
const HEREDOC = /<<(-?)(["']?)([A-Za-z_][A-Za-z0-9_]*)\2/g;

/** The instructions of `source` in order, each with the lines it spans. */
export function readInstructions(source: string): Instruction[] {
  const lines = source.split("\n");
  const instructions: Instruction[] = [];
  let i = 0;
  while (i < lines.length) {
    const start = i;
    const first = lines[i] ?? "";
    i++;
    if (first.trim() === "" || first.trimStart().startsWith("#")) continue;
    // Continuations: a trailing backslash joins the next line (comment lines inside are dropped).
    let logical = first;
    while (logical.endsWith("\\") && i < lines.length) {
      logical = logical.slice(0, -1);
      const next = lines[i] ?? "";
      i++;
      if (next.trimStart().startsWith("#")) {
        logical += "\\";
        continue;
      }
      logical += next;
    }
    const m = /^\s*([A-Za-z]+)\s*(.*)$/.exec(logical);
    if (!m) throw new Error(`line ${start + 1}: not an instruction`);
    const keyword = (m[1] as string).toUpperCase();
    let text = m[2] as string;
    const flags: Array<[string, string]> = [];
    for (let f = FLAG.exec(text); f; f = FLAG.exec(text)) {
      flags.push([f[1] as string, f[2] ?? ""]);
      text = text.slice(f[0].length);
    }
    const heredocs: Instruction["heredocs"] = [];
    for (const h of text.matchAll(HEREDOC)) {
      const name = h[3] as string;
      const body: string[] = [];
      for (;;) {
        if (i >= lines.length) throw new Error(`line ${start + 1}: heredoc ${name} is never closed`);
        const raw = lines[i] as string;
        i++;
        const l = h[1] ? raw.replace(/^\t+/, "") : raw;
        if (l === name) break;
        body.push(l);
      }
      heredocs.push({ name, body: `${body.join("\n")}\n`, quoted: h[2] !== "" });
    }
    instructions.push({ keyword, flags, text: text.trim(), heredocs, line: start + 1, endLine: i });
  }
  return instructions;
}

export function parseDockerfile(source: string): Dockerfile {
  const instructions = readInstructions(source);

  const args = new Map<string, string>();
  const stages: Stage[] = [];
  for (const ins of instructions) {
    if (ins.keyword === "FROM") {
      const [image, as, name, ...rest] = ins.text.split(/\s+/);
      if (!image || rest.length > 0 || (as !== undefined && (as.toUpperCase() !== "AS" || !name))) {
        throw new Error(`line ${ins.line}: FROM takes an image and an optional AS name`);
      }
      if (ins.flags.length > 0) throw new Error(`line ${ins.line}: FROM flags are not supported`);
      stages.push({ from: substitute(image, args, ins.line), name: name ?? null, instructions: [] });
    } else if (stages.length === 0) {
      if (ins.keyword !== "ARG") throw new Error(`line ${ins.line}: only ARG may come before FROM`);
      const arg = /^([A-Za-z_][A-Za-z0-9_]*)=(\S+)$/.exec(ins.text);
      if (!arg) throw new Error(`line ${ins.line}: a global ARG needs a default (NAME=value)`);
      args.set(arg[1] as string, arg[2] as string);
    } else {
      (stages.at(-1) as Stage).instructions.push(ins);
    }
  }
  if (stages.length === 0) throw new Error("no FROM");
  return { args, stages };
}

/** `$NAME` and `${NAME}` of the global ARGs, which Docker substitutes in FROM lines. */
function substitute(text: string, args: Map<string, string>, line: number): string {
  return text.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)/g, (_, a, b) => {
    const value = args.get(a ?? b);
    if (value === undefined) throw new Error(`line ${line}: ARG ${a ?? b} is not declared`);
    return value;
  });
}
