import type { CommandTable } from "./registry";

// Shell completion (`benchwright completion bash|zsh`) and "did you mean" for a mistyped command,
// both from the command table, so a new command completes and is suggested without more code.

/** The edit distance between two strings (insertions, deletions, substitutions). */
export function levenshtein(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      current[j] = Math.min(
        (previous[j] as number) + 1,
        (current[j - 1] as number) + 1,
        (previous[j - 1] as number) + cost,
      );
    }
    previous = current;
  }
  return previous[b.length] as number;
}

/** Every command name and every group of them (`vault`, `vault secrets`). */
function candidates(names: string[]): string[] {
  const all = new Set<string>();
  for (const name of names) {
    const words = name.split(" ");
    for (let n = 1; n <= words.length; n++) all.add(words.slice(0, n).join(" "));
  }
  return [...all];
}

/**
 * The command or group nearest what was typed (its words, before any flag), if it is near enough
 * to be a slip rather than another word: at most 2 edits, and fewer than a third of its length.
 */
export function suggest(typed: string[], names: string[]): string | null {
  let best: { name: string; distance: number } | null = null;
  for (const name of candidates(names)) {
    const n = name.split(" ").length;
    if (typed.length < n) continue;
    const distance = levenshtein(typed.slice(0, n).join(" "), name);
    if (distance === 0) continue;
    const better =
      !best || distance < best.distance || (distance === best.distance && name.length > best.name.length);
    if (distance <= 2 && distance * 3 <= name.length && better) best = { name, distance };
  }
  return best?.name ?? null;
}

/** One line per command: its name, then the flags it takes (`--json`, `--profile`, `--help` always). */
function lines(table: CommandTable, extra: Record<string, string[]>): string {
  const rows = Object.entries(table).map(([name, c]) => {
    const flags = [...Object.keys(c.options ?? {}).map((f) => `--${f}`), "--json", "--profile", "--help"];
    return `${name}:${flags.join(" ")}`;
  });
  for (const [name, flags] of Object.entries(extra)) rows.push(`${name}:${[...flags, "--help"].join(" ")}`);
  return rows.join("\n");
}

export function completionScript(
  shell: "bash" | "zsh",
  table: CommandTable,
  extra: Record<string, string[]>,
): string {
  const table_ = lines(table, extra).replaceAll("'", "");
  if (shell === "bash") {
    return `# benchwright completion for bash: eval "$(benchwright completion bash)" in ~/.bashrc
_benchwright_commands='${table_}'
_benchwright() {
  local cur="\${COMP_WORDS[COMP_CWORD]}" typed="" line name flags next words="" i
  for ((i = 1; i < COMP_CWORD; i++)); do typed+="\${COMP_WORDS[i]} "; done
  while IFS= read -r line; do
    name="\${line%%:*}" flags="\${line#*:}"
    if [[ "$name " == "$typed"* ]]; then
      next="\${name#"$typed"}" next="\${next%% *}"
      [[ -n "$next" && " $words " != *" $next "* ]] && words+="$next "
    elif [[ "$typed" == "$name "* ]]; then
      words+="$flags "
    fi
  done <<< "$_benchwright_commands"
  [[ -z "$typed" ]] && words+="--version --help "
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _benchwright benchwright
`;
  }
  return `#compdef benchwright
# benchwright completion for zsh: eval "$(benchwright completion zsh)" in ~/.zshrc (after compinit)
_benchwright_commands='${table_}'
_benchwright() {
  local typed="" line name flags next i
  local -a cands
  for (( i = 2; i < CURRENT; i++ )); do typed+="\${words[i]} "; done
  for line in "\${(@f)_benchwright_commands}"; do
    name="\${line%%:*}" flags="\${line#*:}"
    if [[ "$name " == "$typed"* ]]; then
      next="\${name#$typed}" next="\${next%% *}"
      [[ -n "$next" ]] && cands+=("$next")
    elif [[ "$typed" == "$name "* ]]; then
      cands+=(\${=flags})
    fi
  done
  [[ -z "$typed" ]] && cands+=(--version --help)
  compadd -- \${(u)cands}
}
compdef _benchwright benchwright
`;
}
