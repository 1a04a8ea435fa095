// The proxy's stdout: one JSON line per record, as always, but written in batches. A write(2) per
// request (Node writes stdout synchronously when it is a file or a pipe) sat on every request's
// path; lines are now gathered and written once per turn of the event loop (setImmediate), in the
// order they were logged. Nothing is lost at exit: the 'exit' hook writes what is left (SIGTERM
// and SIGINT reach it through main.ts's shutdown and process.exit), and a reader still sees whole
// lines, only several to a read now and then.

export interface LogLines {
  /** Queues one line (a newline is added). */
  write(line: string): void;
  /** Writes every queued line now. */
  flush(): void;
  /** Flushes, and stops watching for exit (a proxy shut down inside a longer-lived process). */
  close(): void;
}

/**
 * The ISO 8601 time of now, formatted once per millisecond: a busy proxy logs many lines in the
 * same millisecond, and toISOString() on each was a measurable share of a line's cost.
 */
export function isoNow(): string {
  const ms = Date.now();
  if (ms !== cachedMs) {
    cachedMs = ms;
    cachedIso = new Date(ms).toISOString();
  }
  return cachedIso;
}
let cachedMs = -1;
let cachedIso = "";

export function logLines(out: NodeJS.WritableStream = process.stdout): LogLines {
  let queued: string[] = [];
  let scheduled = false;
  const flush = () => {
    scheduled = false;
    if (queued.length === 0) return;
    const text = `${queued.join("\n")}\n`;
    queued = [];
    out.write(text);
  };
  process.on("exit", flush);
  return {
    write(line) {
      queued.push(line);
      if (!scheduled) {
        scheduled = true;
        setImmediate(flush);
      }
    },
    flush,
    close() {
      flush();
      process.off("exit", flush);
    },
  };
}
