import { login, logout, whoami } from "../commands/account";
import { DEFAULT_URL } from "../commands/shared";
import { type CommandTable, none, str } from "../registry";

// Logging in and out, and who you are logged in as. Each takes --profile (main.ts), one saved
// login per deployment: `benchwright login --profile staging --url https://...`.

export const ACCOUNT_COMMANDS: CommandTable = {
  login: {
    usage: "benchwright login [--url URL]",
    summary: "store the API's URL and your API key (read from standard input or a prompt)",
    help:
      `The key is read from standard input when it is piped, else at a prompt that does not echo; it is\n` +
      `never an argument. It is checked (GET /v1/me) before it is saved to\n` +
      `$XDG_CONFIG_HOME/benchwright/config.json (or ~/.config/benchwright/config.json), mode 0600;\n` +
      `with --profile NAME (or BENCHWRIGHT_PROFILE=NAME) to profiles/NAME.json beside it, so each\n` +
      `deployment keeps its own login and every command takes the same --profile.\n` +
      `--url defaults to ${DEFAULT_URL} (npm start). Scripts may instead set BENCHWRIGHT_API_KEY\n` +
      `(and BENCHWRIGHT_URL) in the environment.`,
    options: { url: { type: "string" } },
    run: (ctx, v, p) => login(ctx, { url: str(v, "url"), positionals: p }),
  },
  logout: {
    usage: "benchwright logout [--revoke]",
    summary: "forget the saved API key (--revoke: and have the API refuse it first)",
    help:
      "Removes the profile's saved login (--profile, BENCHWRIGHT_PROFILE, else the default). With\n" +
      "--revoke the key is revoked at the API first (DELETE /v1/api-keys/{id}), so a copy of the file\n" +
      "is of no use either; if that fails the file is kept. BENCHWRIGHT_API_KEY is not touched.",
    options: { revoke: { type: "boolean" } },
    run: async (ctx, v, p) => {
      none(p, "logout");
      await logout(ctx, { revoke: v.revoke === true });
    },
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
