import { login, whoami } from "../commands/account";
import { DEFAULT_URL } from "../commands/shared";
import { type CommandTable, none, str } from "../registry";

// Logging in, and who you are logged in as.

export const ACCOUNT_COMMANDS: CommandTable = {
  login: {
    usage: "benchwright login [--url URL]",
    summary: "store the API's URL and your API key (read from standard input or a prompt)",
    help:
      `The key is read from standard input when it is piped, else at a prompt that does not echo; it is\n` +
      `never an argument. It is checked (GET /v1/me) before it is saved to\n` +
      `$XDG_CONFIG_HOME/benchwright/config.json (or ~/.config/benchwright/config.json), mode 0600.\n` +
      `--url defaults to ${DEFAULT_URL} (npm start). Scripts may instead set BENCHWRIGHT_API_KEY\n` +
      `(and BENCHWRIGHT_URL) in the environment.`,
    options: { url: { type: "string" } },
    run: (ctx, v, p) => login(ctx, { url: str(v, "url"), positionals: p }),
  },
  whoami: {
    usage: "benchwright whoami",
    summary: "the user, environment and key you are logged in as",
    run: async (ctx, _v, p) => {
      none(p, "whoami");
      await whoami(ctx);
    },
  },
};
