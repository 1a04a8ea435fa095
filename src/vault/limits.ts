import { defaultPlaceholderEnv, EnvName } from "@benchwright/shared/contract/placeholder";
import { RequestLimits } from "@benchwright/shared/contract/policy";
import { fail, ok, type Result } from "../errors";

// The vault's checks of a rule's or host entry's method and path limits (cases N3, N4) and of a
// rule's placeholder variable (N1), shared by the vault's writes (rules.ts, hosts.ts) and the dry
// run, so a draft is held to what the vault would save. The grammar is the contract's
// (policy.ts, placeholder.ts); the API takes plain strings and answers here with a stable code.

/** Limits as a write gives them: undefined keeps what is stored, null is none. */
export interface LimitsInput {
  methods?: readonly string[] | null | undefined;
  paths?: readonly string[] | null | undefined;
}

const issues = (e: { issues: { path: PropertyKey[]; message: string }[] }) =>
  e.issues.map((i) => (i.path.length > 0 ? `[${i.path.join(".")}]: ${i.message}` : i.message)).join("; ");

function checkList(
  at: string,
  schema: (typeof RequestLimits)["methods"] | (typeof RequestLimits)["paths"],
  input: readonly string[] | null | undefined,
): Result<string[] | null | undefined> {
  if (input === undefined || input === null) return ok(input);
  const parsed = schema.safeParse(input);
  if (!parsed.success) {
    const none = input.length === 0 ? " (null is no limit)" : "";
    return fail("invalid_limit", `${at}: ${issues(parsed.error)}${none}`);
  }
  // Once each, in the order given: a repeat changes nothing the proxy does.
  return ok(parsed.data === null ? null : [...new Set(parsed.data)]);
}

/** Limits in the contract's grammar (methods uppercased), or invalid_limit naming the bad one. */
export function checkLimits(
  input: LimitsInput,
  prefix = "",
): Result<{ methods?: string[] | null | undefined; paths?: string[] | null | undefined }> {
  const methods = checkList(`${prefix}methods`, RequestLimits.methods, input.methods);
  if (!methods.ok) return methods;
  const paths = checkList(`${prefix}paths`, RequestLimits.paths, input.paths);
  if (!paths.ok) return paths;
  return ok({ methods: methods.value, paths: paths.value });
}

/** Limits on a block entry are refused: a blocked host's requests never get that far. */
export const limitsOnBlock = (pattern: string, at = "") =>
  fail(
    "limits_on_block",
    `${at}${pattern} is blocked, so it has no method or path limits: only an allowed host may carry them.`,
  );

/** A rule's chosen placeholder variable: the contract's EnvName, or invalid_placeholder_env. */
export function checkPlaceholderEnv(input: string, at = "placeholderEnv"): Result<string> {
  const parsed = EnvName.safeParse(input);
  return parsed.success
    ? ok(parsed.data)
    : fail("invalid_placeholder_env", `${at}: ${JSON.stringify(input)}: ${issues(parsed.error)}`);
}

/**
 * The variable a rule's placeholder goes in, as the policy carries it: none when the rule has
 * none, its own name when it chose one, else the secret's name made portable (none when even
 * that is not a usable name, e.g. a secret named `bw-token` → BW_ is the platform's).
 */
export function resolvePlaceholderEnv(rule: {
  secret: string;
  placeholder: boolean;
  placeholderEnv: string | null;
}): string | null {
  if (!rule.placeholder) return null;
  return rule.placeholderEnv ?? defaultPlaceholderEnv(rule.secret);
}
