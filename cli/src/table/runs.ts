import { runsArtifacts } from "../commands/artifacts";
import { demo } from "../commands/demo";
import { blockedHosts, egressRoutes, limitRefusals, modelCalls, strayPlaceholders } from "../commands/logs";
import {
  commandOf,
  runsControl,
  runsFollow,
  runsLaunch,
  runsLinger,
  runsList,
  runsShow,
} from "../commands/runs";
import { SPEC_FILE, UsageError } from "../commands/shared";
import { CREDENTIAL_PATTERNS } from "../pack";
import { type CommandTable, list, none, one, page, pageOf, str } from "../registry";

// Runs, their logs and the demo.

export const RUNS_COMMANDS: CommandTable = {
  "runs launch": {
    usage:
      "benchwright runs launch [options] -- <command>...  |  --benchmark NAME  |  --from FOLDER [--include-secret-file PATH]...",
    summary: "launch a run (--follow: and follow it to its end)",
    help:
      "Everything after -- is one command, run by sh -c in the sandbox (one word: as written, so\n" +
      "-- 'make && ./bench' works; several: each kept as one argument); --command CMD (repeatable) gives\n" +
      "several commands.\n" +
      "\n" +
      `--from FOLDER reads FOLDER/${SPEC_FILE}, a run spec as POST /v1/runs takes it (commands, setup,\n` +
      "tasks, model, egress, lingerSeconds...), and packs the folder into a .tar.gz that is uploaded\n" +
      "(POST /v1/bundles, with progress on a terminal) and unpacked into each work and task sandbox's\n" +
      "home before setup; the spec's bundle is set to its sha256. What is packed: every file the\n" +
      `folder's .gitignore files do not exclude, never .git, always ${SPEC_FILE}; with "files" in\n` +
      `${SPEC_FILE} (gitignore-style patterns, e.g. ["*.py", "setup.sh", "data/"]) only what they match.\n` +
      "Refused (nothing is sent; each offending file is named): a symlink pointing outside the folder, a\n" +
      "device, FIFO or socket, and files that look like credentials:\n" +
      `  ${CREDENTIAL_PATTERNS.join("  ")}\n` +
      "(matched against the file's name, any letter case). --include-secret-file PATH (relative to the\n" +
      "folder; repeatable) packs one all the same. The same folder packs to the same sha256.\n" +
      `--from FILE.json sends that spec alone (nothing packed), as does a folder with only ${SPEC_FILE}.\n` +
      "\n" +
      "Options: --model NAME (a vault model), --budget calls=N,input=N,output=N (the model's budget:\n" +
      "any of them, k and m allowed, e.g. calls=1000,output=200k; past it the lane refuses calls),\n" +
      "--egress direct|local, --backend sandbox0|e2b|local,\n" +
      "--linger 15m (keep the proxy after the commands end), --follow (exit 4 unless the run completes).",
    options: {
      command: { type: "string", multiple: true },
      benchmark: { type: "string" },
      from: { type: "string" },
      "include-secret-file": { type: "string", multiple: true },
      model: { type: "string" },
      budget: { type: "string" },
      egress: { type: "string" },
      backend: { type: "string" },
      linger: { type: "string" },
      follow: { type: "boolean", short: "f" },
    },
    rest: true,
    run: async (ctx, v, p, rest) => {
      if (p.length > 0)
        throw new UsageError(`put the command after --: benchwright runs launch -- ${p.join(" ")}`);
      const commands = [...list(v, "command")];
      if (rest.length > 0) commands.push(commandOf(rest));
      await runsLaunch(ctx, {
        commands,
        benchmark: str(v, "benchmark"),
        from: str(v, "from"),
        includeSecretFiles: list(v, "include-secret-file"),
        model: str(v, "model"),
        budget: str(v, "budget"),
        egress: str(v, "egress"),
        backend: str(v, "backend"),
        linger: str(v, "linger"),
        follow: v.follow === true,
      });
    },
  },
  "runs follow": {
    usage: "benchwright runs follow RUN_ID",
    summary: "live status and output until the run's commands end (exit 4 unless it completes)",
    help:
      "Streams the run's trace (GET /v1/runs/{id}/events) as it grows and exits when its commands are\n" +
      "over: 0 when the run completed, 4 otherwise. A 429, a 5xx or a dropped connection is waited out\n" +
      "(the answer's Retry-After, else 1, 2, 4 ... 30 s; 8 failures in a row end it with exit 1) and the\n" +
      "stream goes on from the last event it printed: nothing is missed or printed twice. --json prints\n" +
      'NDJSON: one {"event": ...} line per event, then {"run": ...} (the run as runs show --json gives it).',
    run: (ctx, _v, p) => runsFollow(ctx, one(p, "run id")),
  },
  "runs show": {
    usage: "benchwright runs show RUN_ID",
    summary: "a run's status, reason, notes, sandboxes and output",
    run: (ctx, _v, p) => runsShow(ctx, one(p, "run id")),
  },
  "runs list": {
    usage: "benchwright runs list [--limit N] [--cursor C]",
    summary: "runs, newest first",
    options: page,
    run: async (ctx, v, p) => {
      none(p, "runs list");
      await runsList(ctx, pageOf(v));
    },
  },
  "runs artifacts": {
    usage: "benchwright runs artifacts RUN_ID [--out DIR]",
    summary: "the files the run's commands left under $BW_OUT (--out DIR: download them)",
    help:
      "Lists each artifact (sandbox, path, size, sha256) and what was not collected and why (over the\n" +
      "size or count bound, a symlink, not a regular file). --out DIR saves each one to\n" +
      "DIR/<sandbox name>/<path>, checked against its sha256 before it is put in place. A name that\n" +
      "would leave DIR (.., an absolute path) is refused, and nothing is written through a symlink in\n" +
      "DIR; exit 1 if any artifact was not saved.",
    options: { out: { type: "string" } },
    run: (ctx, v, p) => runsArtifacts(ctx, one(p, "run id"), { out: str(v, "out") }),
  },
  "runs cancel": {
    usage: "benchwright runs cancel RUN_ID",
    summary: "stop a run (its sandboxes are torn down)",
    run: (ctx, _v, p) => runsControl(ctx, "cancel", one(p, "run id")),
  },
  "runs halt": {
    usage: "benchwright runs halt RUN_ID",
    summary: "halt a run for review: its commands stop, its proxy keeps enforcing",
    run: (ctx, _v, p) => runsControl(ctx, "halt", one(p, "run id")),
  },
  "runs resume": {
    usage: "benchwright runs resume RUN_ID",
    summary: "resume a halted run",
    run: (ctx, _v, p) => runsControl(ctx, "resume", one(p, "run id")),
  },
  "runs linger": {
    usage: "benchwright runs linger RUN_ID DURATION",
    summary: "keep the run's proxy this long after its commands end (e.g. 30m, 2h; 0 ends it)",
    run: async (ctx, _v, p) => {
      if (p.length !== 2) throw new UsageError("expected a run id and a duration (e.g. 30m)");
      await runsLinger(ctx, p[0] as string, p[1] as string);
    },
  },
  "logs blocked-hosts": {
    usage: "benchwright logs blocked-hosts [RUN_ID] [--limit N] [--cursor C]",
    summary: "hosts a run's boundary refused (no RUN_ID: across all your runs)",
    options: page,
    run: async (ctx, v, p) => {
      if (p.length > 1) throw new UsageError("expected at most one run id");
      await blockedHosts(ctx, p[0], pageOf(v));
    },
  },
  "logs egress-routes": {
    usage: "benchwright logs egress-routes RUN_ID [--limit N] [--cursor C]",
    summary: "hosts the run reached and by which route",
    options: page,
    run: (ctx, v, p) => egressRoutes(ctx, one(p, "run id"), pageOf(v)),
  },
  "logs limit-refusals": {
    usage: "benchwright logs limit-refusals RUN_ID [--limit N] [--cursor C]",
    summary: "requests the run's proxy refused for a method or path limit (never the path)",
    options: page,
    run: (ctx, v, p) => limitRefusals(ctx, one(p, "run id"), pageOf(v)),
  },
  "logs stray-placeholders": {
    usage: "benchwright logs stray-placeholders RUN_ID [--limit N] [--cursor C]",
    summary: "placeholders sent to a host other than their rule's (out unswapped)",
    options: page,
    run: (ctx, v, p) => strayPlaceholders(ctx, one(p, "run id"), pageOf(v)),
  },
  "logs model-calls": {
    usage: "benchwright logs model-calls RUN_ID [--limit N] [--cursor C]",
    summary: "the run's calls to its declared model (counts and tokens, never prompts)",
    options: page,
    run: (ctx, v, p) => modelCalls(ctx, one(p, "run id"), pageOf(v)),
  },
  demo: {
    usage: "benchwright demo",
    summary: "what npm start shows: a run with a key injected and a host refused",
    help:
      "Runs the built-in demo benchmark on the stack npm start brings up, as its dev user\n" +
      "(benchwright login < .data/dev-api-key), follows it, and checks what the boundary did.",
    run: async (ctx, _v, p) => {
      none(p, "demo");
      await demo(ctx);
    },
  },
};
