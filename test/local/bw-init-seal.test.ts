import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { detectCgroups } from "../../local-agent/cgroups";
import { onPath } from "../../scripts/lib/can-isolate";
import { until } from "../until";

// `bw-init seal <id>` (proxy-image/bw-init.sh), the real script, on real kernel objects: real
// processes in real cgroups of their own (pids hierarchy in v1, the unified one in v2), real
// sessions, uids and SIGKILL. In a sandbox0 pod it runs in the bw-seal container, which shares the
// pod's PID namespace, and ends the setup stage: it kills every process whose /proc/<pid>/cgroup
// names the setup container's runtime id, and every root process outside its own cgroup, sparing
// PID 1, then prints {"killed":N}.
//
// It needs a PID namespace of its own: the script scans /proc and SIGKILLs every root process
// whose cgroup differs from its own, which on this machine would be nearly everything. So all of
// it runs in `unshare --pid --fork --mount --mount-proc`, a fresh PID namespace with its own
// /proc, under a driver shell that is the namespace's PID 1 (which the script spares, as it spares
// the pod's pause process). The driver runs the script only once the namespace's /proc lists
// exactly PID 1 and the processes it started, and the namespace dies with the driver.
//
// The pod, rebuilt: cgroups bw-seal-test-<random>/{cri-containerd-<id>.scope, work-*, seal-*,
// other-*} stand for the setup container (containerd names a container's cgroup by its runtime
// id), the work container, the bw-seal container and anything else; each process writes its own
// pid to its cgroup's cgroup.procs and then execs its program (no window in the wrong cgroup).

const SEAL_UID = 10001;

type Cgroup = "setup" | "work" | "seal" | "other";
interface Proc {
  name: string;
  cgroup: Cgroup;
  uid: 0 | typeof SEAL_UID;
  /** Left its session and its parent (setsid, double fork): re-parented to PID 1. */
  daemon?: boolean;
  fate: "killed" | "survives";
  why: string;
}

// What the namespace holds when the script runs, besides PID 1 and the script itself. Each a
// `sleep 1000`.
const PROCS: Proc[] = [
  { name: "setup-root", cgroup: "setup", uid: 0, fate: "killed", why: "in setup's cgroup" },
  {
    name: "setup-daemon",
    cgroup: "setup",
    uid: 0,
    daemon: true,
    fate: "killed",
    why: "in setup's cgroup, whatever session and parent it has",
  },
  {
    name: "setup-user",
    cgroup: "setup",
    uid: SEAL_UID,
    fate: "killed",
    why: "in setup's cgroup, whatever its uid",
  },
  { name: "work-user", cgroup: "work", uid: SEAL_UID, fate: "survives", why: "the work container, not root" },
  { name: "other-root", cgroup: "other", uid: 0, fate: "killed", why: "root outside the seal cgroup" },
  { name: "other-user", cgroup: "other", uid: SEAL_UID, fate: "survives", why: "neither setup's nor root" },
  { name: "sealer", cgroup: "seal", uid: 0, fate: "survives", why: "root, but in the seal cgroup" },
];
const EXPECTED_KILLED = PROCS.filter((p) => p.fate === "killed").length;

const SCRIPT = resolve(import.meta.dirname, "../../proxy-image/bw-init.sh");
const PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/** Where the test's cgroups go (below this process's own), and the /proc/<pid>/cgroup key. */
function cgroupBase(): { base: string; key: string } | string {
  const found = detectCgroups();
  if (!found.ok) return found.problem;
  const { version, parents } = found.host;
  // detectCgroups names the agent's parent, <own cgroup>/benchwright: the test's goes beside it.
  if (version === 1) return parents.pids ? { base: dirname(parents.pids), key: "pids" } : "no cgroup v1 pids";
  return parents.unified ? { base: dirname(parents.unified), key: "" } : "no cgroup v2";
}

function whyNot(): string | null {
  if (process.platform !== "linux") return "not Linux";
  if (process.getuid?.() !== 0) return "not root";
  const missing = ["unshare", "setpriv", "setsid", "awk"].filter((b) => !onPath(b));
  if (missing.length > 0) return `missing ${missing.join(", ")}`;
  const cg = cgroupBase();
  return typeof cg === "string" ? cg : null;
}

const SKIP = whyNot();
if (SKIP) console.warn(`bw-init seal test skipped: ${SKIP} (it needs root on Linux, unshare and setpriv)`);

// The driver, PID 1 of the namespace. Only builtins between the first start and the first seal
// (no child of its own can show in /proc then); its report is one JSON line on stdout.
function driver(): string {
  const starts = PROCS.map((p) => {
    const cg = `"$BW_CG_${p.cgroup.toUpperCase()}"`;
    if (p.daemon) return `daemon ${p.name} ${cg}`;
    const user = p.uid === 0 ? "" : ` setpriv --reuid ${p.uid} --regid ${p.uid} --clear-groups`;
    return `start ${p.name} ${cg}${user}`;
  });
  return `
set -u
D=$BW_DIR
NAMES="${PROCS.map((p) => p.name).join(" ")}"
fail() { printf '{"error":"%s"}\\n' "$1"; exit 1; }
[ "$$" = 1 ] || fail "the driver is not PID 1 of a PID namespace"

# start <name> <cgroup> [setpriv ...]: sleep 1000 in that cgroup, its pid in $D/<name>.pid.
start() {
  name=$1 cg=$2
  shift 2
  sh -c 'echo $$ >"$1/cgroup.procs" || exit 97; echo $$ >"$2"; shift 2; exec "$@" sleep 1000' \\
    start "$cg" "$D/$name.pid" "$@" </dev/null >/dev/null 2>&1 &
}
# daemon <name> <cgroup>: a root sleep 1000 in that cgroup that left its session (setsid) and its
# parent (the shell that started it exits): re-parented to PID 1, in a session of its own.
daemon() {
  sh -c 'echo $$ >"$1/cgroup.procs" || exit 97; exec setsid sh -c '\\''sleep 1000 & echo $! >"$0"'\\'' "$2"' \\
    daemon "$2" "$D/$1.pid" </dev/null >/dev/null 2>&1 &
}
pidof_() { pid=; [ -s "$D/$1.pid" ] && read -r pid <"$D/$1.pid"; [ -n "$pid" ]; }
# waitfor <condition...>: every 50 ms, for up to 10 s.
waitfor() {
  i=0
  until "$@"; do
    i=$((i + 1))
    [ "$i" -le 200 ] || return 1
    sleep 0.05
  done
}
# Every process started has exec'd its sleep (so it has its final uid), and /proc lists exactly
# them and PID 1: no intermediate shell, no zombie, nothing of the machine's.
ready() {
  want=" 1 "
  for name in $NAMES; do
    pidof_ "$name" || return 1
    comm= state=
    read -r _ comm state _ 2>/dev/null <"/proc/$pid/stat" || return 1
    [ "$comm" = "(sleep)" ] && [ "$state" = S ] || return 1
    want="$want$pid "
  done
  seen=
  for dir in /proc/[0-9]*; do
    p=\${dir#/proc/}
    case $want in *" $p "*) ;; *) return 1 ;; esac
    seen="$seen $p"
  done
  SEEN=$seen
}
# kill9 <hex signal mask>: SIGKILL (bit 8, the third hex digit from the right) is pending.
kill9() { t=\${1%??}; t=\${t#"\${t%?}"}; case $t in [13579bdf]) return 0 ;; esac; return 1; }
# Each process started sleeps untouched (S, no SIGKILL pending) or is dead (a zombie or gone).
settled() {
  for name in $NAMES; do
    pidof_ "$name"
    state= sig= shd=
    while read -r k v _; do
      case $k in State:) state=$v ;; SigPnd:) sig=$v ;; ShdPnd:) shd=$v ;; esac
    done 2>/dev/null <"/proc/$pid/status"
    case $state in
    "" | Z | X) ;;
    S) if kill9 "$sig" || kill9 "$shd"; then return 1; fi ;;
    *) return 1 ;;
    esac
  done
}
# snapshot: {"<name>":{pid, state ("" when gone), uid, ppid, pgrp, sid, cgroup}, ...}
snapshot() {
  sep=
  printf '{'
  for name in $NAMES; do
    pidof_ "$name"
    state= uid= ppid= pgrp= sid= cg=
    while read -r k v _; do
      case $k in State:) state=$v ;; Uid:) uid=$v ;; esac
    done 2>/dev/null <"/proc/$pid/status"
    read -r _ _ _ ppid pgrp sid _ 2>/dev/null <"/proc/$pid/stat"
    while IFS= read -r line; do
      case $line in *":$BW_CG_KEY:"*) cg=\${line#*:"$BW_CG_KEY":} ;; esac
    done 2>/dev/null <"/proc/$pid/cgroup"
    printf '%s"%s":{"pid":%s,"state":"%s","uid":%s,"ppid":%s,"pgrp":%s,"sid":%s,"cgroup":"%s"}' \\
      "$sep" "$name" "$pid" "$state" "\${uid:-null}" "\${ppid:-null}" "\${pgrp:-null}" "\${sid:-null}" "$cg"
    sep=,
  done
  printf '}'
}
# seal <label> <id>: bw-init.sh seal <id> from the seal cgroup; its output in $D/<label>.{out,err}.
seal() {
  sh -c 'echo $$ >"$1/cgroup.procs" || exit 97; exec sh "$2" seal "$3"' \\
    seal "$BW_CG_SEAL" "$BW_SCRIPT" "$2" </dev/null >"$D/$1.out" 2>"$D/$1.err"
  echo $? >"$D/$1.rc"
}
text() { sed -e 's/\\\\/\\\\\\\\/g' -e 's/"/\\\\"/g' -e 's/\t/\\\\t/g' "$1" | awk '{ printf "%s\\\\n", $0 }'; }
result() { read -r rc <"$D/$1.rc"; printf '{"rc":%s,"stdout":"%s","stderr":"%s"}' "$rc" "$(text "$D/$1.out")" "$(text "$D/$1.err")"; }

${starts.join("\n")}
waitfor ready || fail "the processes did not start, or /proc shows more than the namespace's"
read -r _ _ _ _ _ driversid _ </proc/1/stat
printf '{"driverSid":%s,"procSeen":"%s","before":%s,' "$driversid" "$SEEN" "$(snapshot)"
seal bad xyz
waitfor settled
printf '"afterBad":%s,' "$(snapshot)"
seal good "$BW_ID"
waitfor settled
printf '"after":%s,"bad":%s,"good":%s}\\n' "$(snapshot)" "$(result bad)" "$(result good)"
`;
}

interface Snap {
  pid: number;
  state: string;
  uid: number | null;
  ppid: number | null;
  pgrp: number | null;
  sid: number | null;
  cgroup: string;
}
interface Run {
  rc: number;
  stdout: string;
  stderr: string;
}
interface Report {
  driverSid: number;
  procSeen: string;
  before: Record<string, Snap>;
  afterBad: Record<string, Snap>;
  after: Record<string, Snap>;
  bad: Run;
  good: Run;
}

const alive = (s: Snap | undefined) => s?.state === "S";
const dead = (s: Snap | undefined) => s !== undefined && (s.state === "" || s.state === "Z");
const hex = (bytes: number) => randomBytes(bytes).toString("hex");

describe.skipIf(SKIP !== null)("bw-init seal, in a PID namespace of its own", () => {
  const id = hex(32); // a containerd runtime id: 64 hex digits
  const parentName = `bw-seal-test-${hex(6)}`;
  const names: Record<Cgroup, string> = {
    setup: `cri-containerd-${id}.scope`,
    work: `work-${hex(6)}`,
    seal: `seal-${hex(6)}`,
    other: `other-${hex(6)}`,
  };
  let parent = "";
  let key = "";
  let dir = "";
  let child: ChildProcess | null = null;
  let report: Report;
  let stderr = "";

  beforeAll(async () => {
    const cg = cgroupBase();
    if (typeof cg === "string") throw new Error(cg);
    key = cg.key;
    parent = join(cg.base, parentName);
    mkdirSync(parent);
    for (const name of Object.values(names)) mkdirSync(join(parent, name));
    dir = mkdtempSync(join(tmpdir(), "bw-seal-test-"));
    writeFileSync(join(dir, "driver.sh"), driver());

    const env: Record<string, string> = {
      PATH,
      BW_DIR: dir,
      BW_ID: id,
      BW_SCRIPT: SCRIPT,
      BW_CG_KEY: key,
    };
    for (const [c, name] of Object.entries(names)) env[`BW_CG_${c.toUpperCase()}`] = join(parent, name);
    // --kill-child: if unshare dies (the timeout below, a crashed worker), so does PID 1 and with
    // it every process of the namespace.
    const proc = spawn(
      "unshare",
      ["--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "sh", join(dir, "driver.sh")],
      { env, stdio: ["ignore", "pipe", "pipe"], timeout: 60_000, killSignal: "SIGKILL" },
    );
    child = proc;
    let stdout = "";
    proc.stdout.on("data", (d: Buffer) => {
      stdout += d;
    });
    proc.stderr.on("data", (d: Buffer) => {
      stderr += d;
    });
    const code = await new Promise<number | null>((r) => proc.on("close", (c) => r(c)));
    child = null;
    if (code !== 0) throw new Error(`driver exited ${code}: ${stdout}${stderr}`);
    report = JSON.parse(stdout) as Report;
  }, 90_000);

  afterAll(async () => {
    child?.kill("SIGKILL");
    if (child) await new Promise((r) => child?.on("close", r));
    const left: string[] = [];
    if (parent) {
      for (const d of [...Object.values(names).map((n) => join(parent, n)), parent]) {
        // PID 1 is gone, so the kernel has killed the namespace; its processes leave their
        // cgroups as they finish exiting. Anything still listed is one of ours: kill it again.
        const gone = await until(
          `cgroup ${d} removed`,
          () => {
            if (!existsSync(d)) return true;
            for (const pid of readFileSync(join(d, "cgroup.procs"), "utf8").split(/\s+/).filter(Boolean)) {
              try {
                process.kill(Number(pid), "SIGKILL");
              } catch {}
            }
            try {
              rmdirSync(d);
              return true;
            } catch {
              return false;
            }
          },
          10_000,
        ).catch(() => false);
        if (!gone) left.push(d);
      }
    }
    if (dir) rmSync(dir, { recursive: true, force: true });
    if (left.length > 0) throw new Error(`left behind: ${left.join(", ")}`);
  }, 30_000);

  it("runs against the pod it means: exactly these processes, in these cgroups, uids, sessions", () => {
    const { before } = report;
    // Just before the script ran, /proc listed the namespace and nothing else: PID 1 and the
    // processes started (the driver checked it, and would not have run the script otherwise).
    const byNumber = (a: number, b: number) => a - b;
    const seen = report.procSeen.trim().split(/\s+/).map(Number);
    expect(seen.sort(byNumber)).toEqual([1, ...PROCS.map((p) => before[p.name]?.pid ?? 0)].sort(byNumber));
    for (const p of PROCS) {
      const s = before[p.name];
      expect(s, p.name).toBeDefined();
      expect(s?.state, p.name).toBe("S");
      expect(s?.uid, p.name).toBe(p.uid);
      expect(s?.cgroup, p.name).toMatch(
        new RegExp(`/${parentName}/${names[p.cgroup].replace(/\./g, "\\.")}$`),
      );
    }
    // The setup cgroup's path names the runtime id; no other cgroup's does.
    expect(before["setup-root"]?.cgroup).toContain(id);
    for (const p of PROCS.filter((q) => q.cgroup !== "setup"))
      expect(before[p.name]?.cgroup).not.toContain(id);
    // The daemon escaped: re-parented to PID 1, in a session and process group of its own.
    const daemon = before["setup-daemon"];
    expect(daemon?.ppid).toBe(1);
    expect(daemon?.sid).not.toBe(report.driverSid);
    expect(daemon?.sid).not.toBe(before["setup-root"]?.sid);
    expect(daemon?.pgrp).not.toBe(before["setup-root"]?.pgrp);
  });

  it("refuses an id that is not hex with exit 2 and a message, and kills nothing", () => {
    expect(report.bad.rc).toBe(2);
    expect(report.bad.stdout).toBe("");
    expect(report.bad.stderr).toContain("seal needs the setup container's runtime id");
    for (const p of PROCS) expect(alive(report.afterBad[p.name]), `${p.name} after a bad id`).toBe(true);
  });

  it(`kills setup's processes and root's outside its cgroup, and prints {"killed":${EXPECTED_KILLED}}`, () => {
    expect(report.good.stderr).toBe("");
    expect(report.good.rc).toBe(0);
    expect(report.good.stdout).toBe(`{"killed":${EXPECTED_KILLED}}\n`);
    for (const p of PROCS) {
      const s = report.after[p.name];
      if (p.fate === "killed") expect(dead(s), `${p.name} killed: ${p.why}; ${JSON.stringify(s)}`).toBe(true);
      else expect(alive(s), `${p.name} survives: ${p.why}; ${JSON.stringify(s)}`).toBe(true);
    }
  });
});
