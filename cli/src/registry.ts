import type { ParseArgsConfig } from "node:util";
import { type Ctx, UsageError } from "./commands/shared";

// What a command of the CLI is, and the small helpers its table entries share (cli/src/table/).
// main.ts dispatches on the table; completion and "did you mean" read its names.

export type Options = NonNullable<ParseArgsConfig["options"]>;
export type Values = Record<string, string | boolean | string[] | undefined>;

export interface Command {
  usage: string;
  summary: string;
  help?: string;
  options?: Options;
  /** Everything after `--` is the command's (runs launch), not options. */
  rest?: boolean;
  run: (ctx: Ctx, values: Values, positionals: string[], rest: string[]) => Promise<void>;
}

export type CommandTable = Record<string, Command>;

export const page: Options = { limit: { type: "string" }, cursor: { type: "string" } };
export const pageOf = (v: Values) => ({
  limit: v.limit === undefined ? undefined : positiveInt(String(v.limit), "--limit"),
  cursor: v.cursor as string | undefined,
});

export function positiveInt(text: string, what: string): number {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) throw new UsageError(`${what} takes a positive whole number`);
  return n;
}

export function one(positionals: string[], what: string): string {
  if (positionals.length !== 1) throw new UsageError(`expected exactly one ${what}`);
  return positionals[0] as string;
}

export function none(positionals: string[], name: string): void {
  if (positionals.length > 0) throw new UsageError(`${name} takes no arguments`);
}

export const str = (v: Values, k: string) => v[k] as string | undefined;
export const list = (v: Values, k: string) => (v[k] as string[] | undefined) ?? [];
