// The E2B templates, built through E2B's template API (the V2 builder) with the e2b SDK's
// Template API from the committed Dockerfiles. No Docker, no E2B CLI: E2B builds the image.
//
// E2B's own Dockerfile reader (`Template().fromDockerfile`, and `e2b template create`, which
// uses it) cannot take these files as they are (SDK 2.51.0, checked): it refuses multi-stage
// builds, turns an ARG into an ENV of the template and leaves `FROM ${ARG}` unsubstituted,
// reads a heredoc COPY as a copy of a file named `<<'EOF'`, drops `--chmod`, and loses the
// backslashes inside quoted RUN text (`printf '#!/bin/sh\n…'` arrives as `#!/bin/shn…`).
// So the translation here does what Docker would, and gives E2B only the final stage:
// - the build stage runs on this machine: its RUNs after its last COPY (the build proper; the
//   dependencies are this checkout's `npm ci`, the sources are this checkout), from the
//   repository root, which is that stage's WORKDIR; `COPY --from=<it>` takes those outputs;
// - global ARG defaults are substituted into FROM (Docker's scope for them);
// - a heredoc becomes a file under proxy-image/dist/e2b/<template>/, copied with its --chmod;
// - a COPY is owned by root unless --chown says otherwise (Docker's default; E2B's would be
//   the current user);
// - like fromDockerfile: user root and workdir / first, and E2B's `user` and /home/user last
//   unless the Dockerfile sets them.
import { spawnSync } from "node:child_process";
import {
  chmodSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, posix } from "node:path";
import { type BuildInfo, Template, type TemplateBuilder } from "e2b";
import { type Instruction, parseDockerfile, type Stage } from "./dockerfile";

/** The templates: name (the default of the Worker var that names it), Dockerfile, size. */
export const E2B_TEMPLATES = [
  {
    key: "proxy",
    env: "E2B_PROXY_TEMPLATE",
    name: "benchwright-proxy",
    dockerfile: "proxy-image/e2b.Dockerfile",
    cpuCount: 1,
    memoryMB: 512,
  },
  {
    key: "work",
    env: "E2B_WORK_TEMPLATE",
    name: "benchwright-work",
    dockerfile: "proxy-image/e2b-work.Dockerfile",
    cpuCount: 2,
    memoryMB: 2048,
  },
] as const;

export type TemplateStep =
  | { kind: "run"; command: string }
  | { kind: "copy"; src: string; dest: string; user: string; mode?: number }
  | { kind: "env"; envs: Record<string, string> }
  | { kind: "workdir"; path: string }
  | { kind: "user"; name: string };

export interface TemplatePlan {
  fromImage: string;
  /** The build stage's build commands, run on this machine from the repository root. */
  hostBuild: string[];
  /** Heredoc files to write (paths relative to the root) before the build. */
  files: Array<{ path: string; body: string; mode: number }>;
  steps: TemplateStep[];
}

const fail = (ins: Instruction, why: string): never => {
  throw new Error(`line ${ins.line}: ${ins.keyword} ${why}`);
};

function flagsOf(ins: Instruction, allowed: string[]): Map<string, string> {
  for (const [name] of ins.flags) if (!allowed.includes(name)) fail(ins, `--${name} is not supported`);
  return new Map(ins.flags);
}

/** The E2B template the final stage of a Dockerfile describes; `staging` holds its heredocs. */
export function planTemplate(source: string, staging: string): TemplatePlan {
  const { stages } = parseDockerfile(source);
  const final = stages.at(-1) as Stage;
  const plan: TemplatePlan = { fromImage: final.from, hostBuild: [], files: [], steps: [] };
  const built = new Set<Stage>();

  const buildStage = (ins: Instruction, ref: string): string => {
    const stage = stages.slice(0, -1).find((s, n) => s.name === ref || String(n) === ref);
    if (!stage) return fail(ins, `--from=${ref} names no earlier stage`);
    const workdir = stage.instructions.findLast((i) => i.keyword === "WORKDIR")?.text;
    if (!workdir?.startsWith("/")) return fail(ins, `--from=${ref}: that stage needs an absolute WORKDIR`);
    if (!built.has(stage)) {
      built.add(stage);
      const lastCopy = stage.instructions.findLastIndex((i) => i.keyword === "COPY");
      for (const run of stage.instructions.slice(lastCopy + 1)) {
        if (run.keyword !== "RUN" || run.heredocs.length > 0 || run.text.startsWith("[")) {
          fail(run, "after the build stage's last COPY must be a shell-form RUN (it runs on this machine)");
        }
        plan.hostBuild.push(run.text);
      }
    }
    return workdir.replace(/\/$/, "");
  };

  for (const ins of final.instructions) {
    switch (ins.keyword) {
      case "RUN":
        flagsOf(ins, []);
        if (ins.heredocs.length > 0 || ins.text.startsWith("[")) fail(ins, "must be in shell form");
        plan.steps.push({ kind: "run", command: ins.text });
        break;
      case "COPY": {
        const flags = flagsOf(ins, ["from", "chmod", "chown"]);
        const chmod = flags.get("chmod");
        if (chmod !== undefined && !/^[0-7]{3,4}$/.test(chmod)) fail(ins, "--chmod must be octal");
        const mode = chmod === undefined ? undefined : Number.parseInt(chmod, 8);
        const user = flags.get("chown") ?? "root";
        const words = ins.text.split(/\s+/);
        const dest = words.pop() as string;
        if (words.length === 0 || !dest.startsWith("/"))
          fail(ins, "needs sources and an absolute destination");
        if (words.length > 1 && !dest.endsWith("/")) fail(ins, "of several sources needs a directory (…/)");
        const from = flags.get("from");
        const root = from === undefined ? null : buildStage(ins, from);
        for (const word of words) {
          const heredoc = ins.heredocs.find((h) => word.replace(/^<<-?["']?|["']$/g, "") === h.name);
          let src: string;
          if (word.startsWith("<<")) {
            if (!heredoc || from !== undefined) return fail(ins, `${word} is not a heredoc of this COPY`);
            src = posix.join(staging, dest.endsWith("/") ? heredoc.name : posix.basename(dest));
            plan.files.push({ path: src, body: heredoc.body, mode: mode ?? 0o644 });
          } else if (root !== null) {
            if (!word.startsWith(`${root}/`)) fail(ins, `${word} is outside the build stage's WORKDIR`);
            src = word.slice(root.length + 1);
          } else {
            if (word.startsWith("/") || posix.normalize(word).startsWith("..")) fail(ins, `${word}: outside`);
            src = posix.normalize(word);
          }
          plan.steps.push({ kind: "copy", src, dest, user, ...(mode === undefined ? {} : { mode }) });
        }
        break;
      }
      case "ENV": {
        flagsOf(ins, []);
        const envs: Record<string, string> = {};
        for (const pair of ins.text.split(/\s+/)) {
          const m = /^([A-Za-z_][A-Za-z0-9_]*)=([^"'$\\]*)$/.exec(pair);
          if (!m) return fail(ins, "takes unquoted NAME=value pairs only");
          envs[m[1] as string] = m[2] as string;
        }
        plan.steps.push({ kind: "env", envs });
        break;
      }
      case "WORKDIR":
        plan.steps.push({ kind: "workdir", path: ins.text });
        break;
      case "USER":
        plan.steps.push({ kind: "user", name: ins.text });
        break;
      default:
        // ARG would become a lasting ENV of the template; CMD/ENTRYPOINT a start command, which
        // these templates must not have (docs/e2b.md); the rest has no E2B step.
        fail(ins, "has no translation to an E2B template step here");
    }
  }
  return plan;
}

/** The plan as the e2b SDK's template builder, the files taken from `root`. */
export function toTemplate(plan: TemplatePlan, root: string): TemplateBuilder {
  let t = Template({ fileContextPath: root }).fromImage(plan.fromImage).setUser("root").setWorkdir("/");
  for (const step of plan.steps) {
    if (step.kind === "run") t = t.runCmd(step.command);
    else if (step.kind === "copy") t = t.copy(step.src, step.dest, { user: step.user, mode: step.mode });
    else if (step.kind === "env") t = t.setEnvs(step.envs);
    else if (step.kind === "workdir") t = t.setWorkdir(step.path);
    else t = t.setUser(step.name);
  }
  if (!plan.steps.some((s) => s.kind === "user")) t = t.setUser("user");
  if (!plan.steps.some((s) => s.kind === "workdir")) t = t.setWorkdir("/home/user");
  return t;
}

export interface BuildTemplatesOptions {
  root: string;
  /** E2B's API; apiUrl/domain empty or absent mean E2B's cloud. */
  connection: { apiKey: string; apiUrl?: string; domain?: string };
  /** Names per Worker var (E2B_PROXY_TEMPLATE, E2B_WORK_TEMPLATE); the table's when absent. */
  names?: Record<string, string | undefined>;
  /** Only these (table keys: proxy, work); all when absent. */
  only?: string[];
  log: (line: string) => void;
}

/** Builds every template, one after the other; throws with E2B's reason on the first failure. */
export async function buildE2bTemplates(options: BuildTemplatesOptions): Promise<BuildInfo[]> {
  const { root, connection, log } = options;
  const selected = E2B_TEMPLATES.filter((t) => !options.only || options.only.includes(t.key));
  const templates = selected.map((t) => {
    const name = options.names?.[t.env] || t.name;
    const staging = posix.join("proxy-image/dist/e2b", name);
    const source = readFileSync(join(root, t.dockerfile), "utf8");
    try {
      return { ...t, name, plan: planTemplate(source, staging) };
    } catch (e) {
      throw new Error(`${t.dockerfile}: ${(e as Error).message}`);
    }
  });

  // The build stage is the same in every Dockerfile: each command runs once. The E2B key is not
  // something npm or esbuild need.
  const { E2B_API_KEY: _key, ...env } = process.env;
  for (const command of new Set(templates.flatMap((t) => t.plan.hostBuild))) {
    log(`$ ${command}`);
    const run = spawnSync("sh", ["-c", command], { cwd: root, env, stdio: ["ignore", "inherit", "inherit"] });
    if (run.status !== 0) throw new Error(`the build stage's command failed: ${command}`);
  }
  for (const t of templates) {
    for (const file of t.plan.files) {
      mkdirSync(dirname(join(root, file.path)), { recursive: true });
      writeFileSync(join(root, file.path), file.body);
      chmodSync(join(root, file.path), file.mode);
    }
    for (const step of t.plan.steps) {
      if (step.kind === "copy" && !existsSync(join(root, step.src))) {
        throw new Error(`${t.name}: ${step.src} (for ${step.dest}) was not built`);
      }
    }
  }

  // E2B's context holds exactly what the templates copy, at the same paths: the SDK applies the
  // context's .dockerignore, and the repository's (for Docker builds) keeps the built files out.
  const context = mkdtempSync(join(tmpdir(), "bw-e2b-context-"));
  try {
    for (const t of templates)
      for (const step of t.plan.steps)
        if (step.kind === "copy") cpSync(join(root, step.src), join(context, step.src), { recursive: true });
    return await buildEach(templates, context, connection, log);
  } finally {
    rmSync(context, { recursive: true, force: true });
  }
}

async function buildEach(
  templates: Array<{
    name: string;
    dockerfile: string;
    cpuCount: number;
    memoryMB: number;
    plan: TemplatePlan;
  }>,
  root: string,
  connection: BuildTemplatesOptions["connection"],
  log: (line: string) => void,
): Promise<BuildInfo[]> {
  const built: BuildInfo[] = [];
  for (const t of templates) {
    log(
      `${t.name}: building from ${t.dockerfile} (${t.cpuCount} CPU, ${t.memoryMB} MB) on ${t.plan.fromImage}`,
    );
    try {
      const info = await Template.build(toTemplate(t.plan, root), t.name, {
        cpuCount: t.cpuCount,
        memoryMB: t.memoryMB,
        apiKey: connection.apiKey,
        apiUrl: connection.apiUrl || undefined,
        domain: connection.domain || undefined,
        onBuildLogs: (entry) => log(`${t.name}: ${entry.toString()}`),
      });
      log(`${t.name}: ready (template ${info.templateId}, build ${info.buildId})`);
      built.push(info);
    } catch (e) {
      throw new Error(`${t.name}: ${(e as Error).message}`);
    }
  }
  return built;
}
