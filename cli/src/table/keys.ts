import { keysCreate, keysList, keysRevoke } from "../commands/keys";
import { type CommandTable, none, one, page, pageOf, str } from "../registry";

// API keys: make, list, revoke (the first key comes from `npm run create-user`).

export const KEYS_COMMANDS: CommandTable = {
  "keys create": {
    usage:
      "benchwright keys create NAME (--out PATH | --print) [--scope read|full] [--expires-in 90d | --expires-at ISO]",
    summary: "make an API key for this environment (shown once: to a new 0600 file, or stdout with --print)",
    help:
      "--scope read makes a key that may only GET (a dashboard, a watcher); the default is full, and a\n" +
      "key never makes a wider key than its own. --expires-in takes a count and m, h or d. The key is\n" +
      "written to PATH (a new file, mode 0600) or, with --print, alone on standard output.",
    options: {
      out: { type: "string" },
      print: { type: "boolean" },
      scope: { type: "string" },
      "expires-in": { type: "string" },
      "expires-at": { type: "string" },
    },
    run: (ctx, v, p) =>
      keysCreate(ctx, one(p, "key name"), {
        out: str(v, "out"),
        print: v.print === true,
        scope: str(v, "scope"),
        expiresIn: str(v, "expires-in"),
        expiresAt: str(v, "expires-at"),
      }),
  },
  "keys list": {
    usage: "benchwright keys list [--limit N] [--cursor C]",
    summary: "this environment's API keys (* marks the one in use; never the keys themselves)",
    options: page,
    run: async (ctx, v, p) => {
      none(p, "keys list");
      await keysList(ctx, pageOf(v));
    },
  },
  "keys revoke": {
    usage: "benchwright keys revoke KEY_ID",
    summary: "revoke an API key: it, and every page session opened with it, is refused at once",
    run: (ctx, _v, p) => keysRevoke(ctx, one(p, "key id")),
  },
};
