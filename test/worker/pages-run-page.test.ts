import { describe, it, vi } from "vitest";
import { runEvents } from "../../src/db/schema";
import { addEvent, addNote, recordTransition } from "../../src/runs/service";
import { loggedIn } from "./browser";
import { newTenant, tenantWithUnreadableVault, withDb } from "./harness";
import { newCanary } from "./leaks";
import { expectPage, has, lacks, launch, textOf } from "./pages-fixtures";
import { driveToEnd, newRun, setRunStatus } from "./run-fixtures";

// A run's dashboard (/runs/{id}, src/pages/run-page.tsx, run-trace.tsx, run-stages.tsx) over the
// real Worker, coordinator and Postgres: the state and why (E1), notes, the bounded trace and
// output, each sandbox's stages (G6, G7), and the 404 page. Its cards and forms have their files.

// Each test logs in and reads several pages over the real database; a few drive a run's alarms.
vi.setConfig({ testTimeout: 60_000 });

describe("a run's page", () => {
  it("a run whose vault is unreadable: stopped, vault_unreadable as a warning, its trace (E1)", async () => {
    const canary = newCanary("e1page");
    const t = await tenantWithUnreadableVault(canary);
    const id = await launch(t);
    await driveToEnd(t, id);
    const b = await loggedIn(t, `/runs/${id}`);
    const res = await b.get(`/runs/${id}`);
    const text = expectPage(res);
    has(text, "stopped");
    has(res.html, /<p class="warning">Stopped: <code>vault_unreadable<\/code>/);
    has(text, "no benchmark code ran");
    // The trace: its transitions with their reasons, and the vault's attempts.
    for (const state of ["queued", "fetching_vault", "finishing", "stopped"]) has(text, `→ ${state}`);
    has(text, "launched");
    has(text, "Vault read attempt 4 of 4 failed");
    // Empty states.
    has(text, "Sandboxes None made.");
    has(text, "No host was refused");
    has(text, "No traffic recorded");
    has(text, "No bug reports");
    has(text, "No command output");
    has(text, "Not proved yet");
    has(text, "The run has ended (stopped)");
    lacks(res.html, canary);
  });

  it("a queued run: its empty states and its controls", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "queued" });
    const b = await loggedIn(t, `/runs/${run.id}`);
    const res = await b.get(`/runs/${run.id}`);
    const text = expectPage(res);
    has(text, "Queued: the run's coordinator has not started it yet");
    has(text, "Nothing: the run's network is as the vault asks");
    has(text, "Sandboxes None made yet.");
    has(res.html, `action="/runs/${run.id}/cancel"`);
    has(res.html, `action="/runs/${run.id}/halt"`);
    has(res.html, `action="/runs/${run.id}/linger"`);
    has(res.html, `href="/runs/${run.id}/proxy"`);
    has(res.html, `action="/runs/${run.id}/bug-reports"`);
  });

  it("a halted run: says so and offers Resume; a lingering one offers no halt", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    // The note the coordinator writes when it halts the run's commands.
    await withDb((db) =>
      addEvent(db, run.id, "halt:1", "note", {
        text: "Halted for review: the run's commands are stopped.",
        halted: true,
      }),
    );
    const b = await loggedIn(t, `/runs/${run.id}`);
    const res = await b.get(`/runs/${run.id}`);
    has(expectPage(res), "running halted for review");
    has(res.html, `action="/runs/${run.id}/resume"`);
    lacks(res.html, `action="/runs/${run.id}/halt"`);
    await setRunStatus(run.id, "lingering");
    const lingering = await b.get(`/runs/${run.id}`);
    has(expectPage(lingering), "Cancel (ends the linger)");
    lacks(lingering.html, `action="/runs/${run.id}/halt"`);
    lacks(lingering.html, `action="/runs/${run.id}/resume"`);
  });

  it("shows the notes with their level, routing_change_not_retrofitted with its advice", async () => {
    const t = await newTenant();
    // A real run with no compute backend: it stops with a plain note and a warning.
    const id = await launch(t);
    await driveToEnd(t, id);
    await withDb((db) =>
      addNote(db, id, {
        level: "warning",
        code: "routing_change_not_retrofitted",
        text: "The vault now needs catch-all routing (block_default), which cannot be installed.",
      }),
    );
    const b = await loggedIn(t, `/runs/${id}`);
    const res = await b.get(`/runs/${id}`);
    expectPage(res);
    has(res.html, /<div class="note"><strong>Note<\/strong> <code>no_proxy<\/code>/);
    has(
      res.html,
      /<div class="warning"><strong>Warning<\/strong> <code>routing_change_not_retrofitted<\/code><div>The vault now needs catch-all routing/,
    );
    has(textOf(res.html), "What to do: relaunch the run");
    has(res.html, /<div class="warning"><strong>Warning<\/strong> <code>(?!routing_change)/);
  });

  it("bounds the trace rows and each sandbox's output, in <details>", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running", spec: { commands: ["echo a", "echo b"] } });
    await withDb(async (db) => {
      await db.insert(runEvents).values(
        Array.from({ length: 400 }, (_, i) => ({
          runId: run.id,
          key: `n:test:${i}`,
          kind: "note" as const,
          detail: { text: `row ${i} of the trace` },
        })),
      );
      const out = (command: number, text: string, end: number) =>
        addEvent(db, run.id, `out:sbx_w:${command}:stdout:${end}`, "output", {
          sandbox: "sbx_w",
          name: "work",
          command,
          stream: "stdout",
          text,
          truncated: false,
        });
      await out(0, `${"x".repeat(70_000)}`, 70_000);
      await addEvent(db, run.id, "exit:sbx_w:0", "output", {
        sandbox: "sbx_w",
        name: "work",
        command: 0,
        exitCode: 0,
        signal: null,
      });
      await out(1, "the last words <b>", 18);
    });
    const b = await loggedIn(t, `/runs/${run.id}`);
    const res = await b.get(`/runs/${run.id}`);
    const text = expectPage(res);
    has(text, "row 0 of the trace");
    has(text, "row 399 of the trace");
    lacks(text, "row 100 of the trace");
    has(text, /… \d+ rows not shown here/);
    has(res.html, "<summary>Output of <strong>work</strong></summary>");
    has(text, "$ command 1: echo a");
    // 64 KiB shown, the rest counted; the second command's output did not fit.
    has(res.html, `${"x".repeat(65_536)}<`);
    lacks(res.html, "x".repeat(65_537));
    has(text, `${70_000 + 18 - 65_536} more characters not shown`);
    lacks(res.html, "<b>");
  });

  // case G6: the run page says which setup command failed and why; case G7: which limit.
  it("shows each sandbox's two stages, the failing setup command (case G6) and the limit hit (case G7)", async () => {
    const t = await newTenant();
    const spec = {
      commands: ["python task_impl.py"],
      setup: ["pip install requests"],
      tasks: [{ name: "t1", commands: ["echo t1"], setup: ["apt-get install -y <nothing>"] }],
    };
    const failed = await newRun(t, { status: "running", spec });
    await withDb(async (db) => {
      const ev = (key: string, kind: "output" | "note" | "proxy", detail: Record<string, unknown>) =>
        addEvent(db, failed.id, key, kind, detail);
      const w = { sandbox: "sbx_w", name: "work" };
      const t1 = { sandbox: "sbx_t", name: "t1" };
      await ev("setup:sbx_w:0:stdout:9", "output", {
        ...w,
        stage: "setup",
        command: 0,
        stream: "stdout",
        text: "installed",
        truncated: false,
      });
      await ev("exit-setup:sbx_w:0", "output", {
        ...w,
        stage: "setup",
        command: 0,
        exitCode: 0,
        signal: null,
      });
      await ev("exit-setup:sbx_t:0", "output", {
        ...t1,
        stage: "setup",
        command: 0,
        exitCode: 0,
        signal: null,
      });
      await ev("exit-setup:sbx_t:1", "output", {
        ...t1,
        stage: "setup",
        command: 1,
        exitCode: 100,
        signal: null,
      });
      await ev("seal:sbx_w", "note", {
        ...w,
        stage: "seal",
        killed: 1,
        text: "The setup stage of work ended.",
      });
      await ev("collect:sbx_t", "note", {
        ...t1,
        stage: "collect",
        ok: true,
        files: 2,
        bytes: 30,
        cut: 1,
        text: "Collected.",
      });
      await recordTransition(db, failed.id, {
        to: "stopped",
        reason: "setup_failed",
        detail: "t1 (sbx_t): setup command 2 exited 100: apt-get install -y <nothing>",
      });
    });
    const b = await loggedIn(t, `/runs/${failed.id}`);
    const res = await b.get(`/runs/${failed.id}`);
    const text = expectPage(res);
    has(text, "A setup command failed, so the run stopped before any command ran after it");
    has(text, "t1 (sbx_t): setup command 2 exited 100: apt-get install -y <nothing>");
    has(res.html, "<summary>Stages of <strong>t1</strong></summary>");
    // The task's setup: the run's, then its own; the failing one marked, the commands not run.
    has(text, "setup setup 1: pip install requests exited 0");
    has(text, "setup setup 2: apt-get install -y <nothing> exited 100");
    has(
      res.html,
      /<tr class="error"><td>setup<\/td><td class="mono">setup 2: apt-get install -y &lt;nothing&gt;/,
    );
    has(text, "execute command 1: echo t1 not run");
    has(text, "$BW_OUT collected 2 file(s), 30 bytes, 1 cut");
    has(text, "sealed: its leftover processes killed, the wiring re-installed 1 process(es) killed");
    // The setup output is shown under its own header, apart from the commands'.
    has(text, "$ setup 1: pip install requests installed");
    lacks(res.html, "<nothing>");

    const killed = await newRun(t, { status: "running", spec: { commands: ["python hog.py"] } });
    await withDb(async (db) => {
      await addEvent(db, killed.id, "exit:sbx_k:0", "output", {
        sandbox: "sbx_k",
        name: "work",
        stage: "execute",
        command: 0,
        exitCode: null,
        signal: "SIGKILL",
        limit: "memory",
      });
      await recordTransition(db, killed.id, {
        to: "stopped",
        reason: "resource_exhausted",
        detail: "work (sbx_k) hit its memory limit (2048 MiB) in command 1",
      });
    });
    const page = expectPage(await b.get(`/runs/${killed.id}`));
    has(page, "A sandbox was killed at a resource limit (work: memory), so the run stopped");
    has(page, "work (sbx_k) hit its memory limit (2048 MiB) in command 1");
    has(page, "execute command 1: python hog.py killed at its memory limit");
  });

  // Issue 34: which sandboxes built a setup image, and which started from one (and whose).
  it("shows the setup image a sandbox kept, and the one another started from with its builder", async () => {
    const t = await newTenant();
    const spec = {
      commands: ["echo work"],
      setup: ["pip install requests"],
      tasks: [{ name: "t1", commands: ["echo t1"] }],
    };
    const run = await newRun(t, { status: "running", spec });
    const kept = `sha256:${"1".repeat(64)}`;
    const older = `sha256:${"2".repeat(64)}`;
    await withDb(async (db) => {
      const ev = (key: string, kind: "output" | "note" | "proxy", detail: Record<string, unknown>) =>
        addEvent(db, run.id, key, kind, detail);
      const w = { sandbox: "sbx_w", name: "work" };
      const t1 = { sandbox: "sbx_t", name: "t1" };
      await ev("exit-setup:sbx_w:0", "output", {
        ...w,
        stage: "setup",
        command: 0,
        exitCode: 0,
        signal: null,
      });
      await ev("seal:sbx_w", "note", { ...w, stage: "seal", killed: 0, text: "Sealed." });
      await ev("setup-image:sbx_w", "note", {
        ...w,
        stage: "setup_image",
        digest: kept,
        bytes: 3 * 1024 * 1024,
        files: 42,
        builtByRunId: run.id,
        builtNow: true,
        text: "Setup image built now.",
      });
      await ev("setup-image:sbx_t", "note", {
        ...t1,
        stage: "setup_image",
        digest: older,
        builtByRunId: "run_before",
        builtNow: false,
        text: "t1 starts from a setup image.",
      });
      await ev("seal:sbx_t", "note", { ...t1, stage: "seal", killed: 0, text: "Sealed." });
      await ev("rewire:sbx_t", "proxy", { ...t1, stage: "execute", installed: true, proof: { ok: true } });
      await ev("exit:sbx_t:0", "output", { ...t1, stage: "execute", command: 0, exitCode: 0, signal: null });
    });
    const b = await loggedIn(t, `/runs/${run.id}`);
    const res = await b.get(`/runs/${run.id}`);
    const text = expectPage(res);
    has(text, "setup setup 1: pip install requests exited 0");
    has(text, `setup setup kept as setup image ${kept} built now (3.0 MiB)`);
    has(text, `setup started from setup image ${older} built by run run_before`);
    has(res.html, '<a href="/runs/run_before">run_before</a>');
    has(text, "sealed: the wiring's files installed from outside (no setup stage) sealed");
    has(text, "execute the wiring proved, before any command proved");
    // The task's setup ran where its image was built: no setup rows of its own.
    has(text, "execute command 1: echo t1 exited 0");
    lacks(text, "setup setup 1: pip install requests not run");
  });

  it("unknown run → a 404 page with a link back", async () => {
    const t = await newTenant();
    const b = await loggedIn(t, "/runs");
    for (const id of ["run_doesnotexist", `run_${"a".repeat(300)}`, "<script>x</script>"]) {
      const res = await b.get(`/runs/${encodeURIComponent(id)}`);
      const text = expectPage(res, 404);
      has(text, "There is no run");
      has(res.html, 'href="/runs"');
      lacks(res.html, "a".repeat(100));
    }
  });
});
