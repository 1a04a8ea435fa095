// `benchwright egress-agent`: the local egress agent (egress-agent.ts) as a command the user runs
// on their own machine. Flags only parse and check here; a bad one exits 2 with a message that
// names the flag (and never repeats a token). Exits 0 when the run ends, 1 when the token stops
// working. The token comes from BENCHWRIGHT_EGRESS_TOKEN or standard input (--token-stdin), never
// from a flag: an argument shows in every process list on the machine and stays in shell
// history (K5), so --token is refused with a message that says what to do instead.
import { isIP } from "node:net";
import { parseArgs } from "node:util";
import { levelOf, logLine } from "@benchwright/shared/contract/log";
import { EgressToken } from "@benchwright/shared/contract/tunnel";
import { parseBlockPattern, startEgressAgent } from "./egress-agent";

const USAGE = `usage: BENCHWRIGHT_EGRESS_TOKEN=<bwe_...> egress-agent --url <control plane URL>
  [--token-stdin]            read the token from standard input (its first line) instead
  [--allow-cidr <cidr>]...   private ranges on your network the agent may dial (default: none)
  [--block <host pattern>]... hosts this agent never dials, whatever the run allows (exact or *.x)
  [--policy-interval-ms <n>] how often to read the run's host policy (default 2000)
  [--insecure-http]          allow a plain http:// URL that is not this machine (development
                             only: the token then crosses the network unencrypted)
The URL may come from BENCHWRIGHT_URL instead. The token is never a flag (process lists).`;

class FlagError extends Error {}

function parseUrl(value: string | undefined, insecureHttp: boolean): string {
  if (!value) throw new FlagError("--url (or BENCHWRIGHT_URL) is required");
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new FlagError("--url is not a URL");
  }
  if (url.username || url.password || url.search || url.hash) {
    throw new FlagError("--url must be the control plane's base URL (no user, query or fragment)");
  }
  const host = url.hostname.replace(/^\[|\]$/g, "");
  const local = host === "localhost" || host === "::1" || (isIP(host) === 4 && host.startsWith("127."));
  // The token goes in a header: over plain http only to this machine.
  if (url.protocol !== "https:" && !(url.protocol === "http:" && (local || insecureHttp))) {
    throw new FlagError(
      "--url must be https:// (plain http:// only to this machine, or with --insecure-http)",
    );
  }
  return `${url.origin}${url.pathname.replace(/\/+$/, "")}`;
}

function parseCidr(value: string): string {
  const [net, bits, extra] = value.split("/");
  const family = isIP(net ?? "");
  const max = family === 4 ? 32 : 128;
  if (family === 0 || extra !== undefined || !/^[0-9]{1,3}$/.test(bits ?? "") || Number(bits) > max) {
    throw new FlagError(`--allow-cidr ${value.slice(0, 64)} is not a CIDR (e.g. 192.168.1.0/24)`);
  }
  return `${net}/${Number(bits)}`;
}

function parse(argv: string[], env: NodeJS.ProcessEnv) {
  let values: ReturnType<typeof read>["values"];
  function read() {
    return parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        url: { type: "string" },
        token: { type: "string" },
        "token-stdin": { type: "boolean" },
        "allow-cidr": { type: "string", multiple: true },
        block: { type: "string", multiple: true },
        "policy-interval-ms": { type: "string" },
        "insecure-http": { type: "boolean" },
        help: { type: "boolean", short: "h" },
      },
    });
  }
  try {
    values = read().values;
  } catch (error) {
    // Node's messages can quote the argument itself, which may be a token: name the flag only.
    const code = (error as { code?: string }).code;
    const flag = /'(--?[A-Za-z][A-Za-z0-9-]*)/.exec((error as Error).message)?.[1];
    if (code === "ERR_PARSE_ARGS_UNKNOWN_OPTION") throw new FlagError(`unknown flag ${flag ?? ""}`.trim());
    if (code === "ERR_PARSE_ARGS_INVALID_OPTION_VALUE")
      throw new FlagError(`${flag ?? "a flag"} needs a value`);
    throw new FlagError("unexpected argument (every value goes after its flag)");
  }
  if (values.help) return null;
  const url = parseUrl(values.url ?? env.BENCHWRIGHT_URL, values["insecure-http"] === true);
  if (values.token !== undefined) {
    throw new FlagError(
      "--token is refused: an argument shows in the process list and shell history. Set " +
        "BENCHWRIGHT_EGRESS_TOKEN in the environment, or pipe the token in with --token-stdin",
    );
  }
  const fromStdin = values["token-stdin"] === true;
  const token = fromStdin ? undefined : env.BENCHWRIGHT_EGRESS_TOKEN;
  if (!fromStdin) checkToken(token, "BENCHWRIGHT_EGRESS_TOKEN");
  const allowCidrs = (values["allow-cidr"] ?? []).map(parseCidr);
  const block = (values.block ?? []).map((value) => {
    const parsed = parseBlockPattern(value);
    if (!parsed.ok) throw new FlagError(`--block ${value.slice(0, 260)}: ${parsed.message}`);
    return parsed.pattern;
  });
  const interval = values["policy-interval-ms"] ?? "2000";
  const policyIntervalMs = Number(interval);
  if (!/^[0-9]{1,6}$/.test(interval) || policyIntervalMs < 200 || policyIntervalMs > 60_000) {
    throw new FlagError("--policy-interval-ms must be a whole number of milliseconds from 200 to 60000");
  }
  return { url, token, allowCidrs, block, policyIntervalMs };
}

function checkToken(token: string | undefined, from: string): asserts token is string {
  if (!token) {
    throw new FlagError(
      from === "standard input"
        ? "standard input held no token (its first line is read)"
        : "no token: set BENCHWRIGHT_EGRESS_TOKEN, or pass --token-stdin and pipe it in",
    );
  }
  if (!EgressToken.safeParse(token).success) {
    throw new FlagError(`${from} is not an egress agent token (bwe_...)`);
  }
}

/** The first line of standard input (a pipe, or a paste at a terminal), trimmed. */
async function firstLine(): Promise<string> {
  if (process.stdin.isTTY) process.stderr.write("egress-agent: paste the run's egress token (bwe_...): ");
  let text = "";
  for await (const chunk of process.stdin) {
    text += String(chunk);
    if (text.includes("\n")) break;
  }
  process.stdin.pause();
  return (text.split("\n")[0] ?? "").trim();
}

async function main(): Promise<void> {
  let options: ReturnType<typeof parse>;
  let token = "";
  try {
    options = parse(process.argv.slice(2), process.env);
    if (options !== null) {
      const read = options.token ?? (await firstLine());
      checkToken(read, "standard input");
      token = read;
    }
  } catch (error) {
    const message = error instanceof FlagError ? error.message : "could not read the flags";
    process.stderr.write(`egress-agent: ${message}\n${USAGE}\n`);
    process.exit(2);
  }
  if (options === null) {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  // Nothing the agent starts needs it; gone from the environment, no child could inherit it.
  delete process.env.BENCHWRIGHT_EGRESS_TOKEN;
  let why = "stopped";
  const agent = startEgressAgent({
    ...options,
    token,
    log: (record) => {
      if (record.event === "stopped" && typeof record.why === "string") why = record.why;
      process.stdout.write(`${logLine(levelOf(record), record)}\n`);
    },
  });
  const quit = () => void agent.stop();
  process.once("SIGINT", quit);
  process.once("SIGTERM", quit);
  void agent.done.then((code) => {
    process.stderr.write(`egress-agent: ${why}\n`);
    process.exit(code);
  });
}

void main();
