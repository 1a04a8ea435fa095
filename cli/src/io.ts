import { closeSync, openSync, rmSync, writeSync } from "node:fs";
import { UsageError } from "./commands/shared";
// Reading a secret (an API key, a vault value) without it ever being an argument: piped on
// standard input, or typed at a prompt that does not echo.

export async function readAll(stream: NodeJS.ReadableStream): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(typeof chunk === "string" ? Buffer.from(chunk) : chunk);
  return Buffer.concat(chunks).toString("utf8");
}

/** One trailing newline is what `echo` and a here-string add; anything else is the value's. */
export function dropTrailingNewline(text: string): string {
  return text.replace(/\r?\n$/, "");
}

export async function promptHidden(question: string): Promise<string> {
  const stdin = process.stdin;
  process.stderr.write(question);
  stdin.setRawMode(true);
  stdin.resume();
  stdin.setEncoding("utf8");
  try {
    return await new Promise<string>((resolve, reject) => {
      let value = "";
      const onData = (chunk: string) => {
        for (const ch of chunk) {
          if (ch === "\r" || ch === "\n" || ch === "\u0004") {
            stdin.off("data", onData);
            process.stderr.write("\n");
            resolve(value);
            return;
          }
          if (ch === "\u0003") {
            stdin.off("data", onData);
            process.stderr.write("\n");
            reject(new Error("interrupted"));
            return;
          }
          if (ch === "\u007f" || ch === "\b") value = value.slice(0, -1);
          else value += ch;
        }
      };
      stdin.on("data", onData);
    });
  } finally {
    stdin.setRawMode(false);
    stdin.pause();
  }
}

/** Piped input if there is any, else a hidden prompt. */
export async function readSecret(question: string): Promise<string> {
  if (process.stdin.isTTY) return promptHidden(question);
  return dropTrailingNewline(await readAll(process.stdin));
}

/** A new 0600 file made before the secret exists, so a key is never made with nowhere to go. */
export interface SecretFile {
  write(secret: string): void;
  /** Removes the (still empty) file: the secret never came. */
  discard(): void;
}

/**
 * Makes a new file for a secret the API shows once (a webhook's signing secret, a new API key),
 * mode 0600. Never over a file that exists (`wx`: a symlink planted there included).
 */
export function reserveSecretFile(path: string): SecretFile {
  let fd: number;
  try {
    fd = openSync(path, "wx", 0o600);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    throw new UsageError(
      code === "EEXIST"
        ? `${path} exists: the secret is written only to a new file`
        : `cannot write ${path}: ${code ?? error}`,
    );
  }
  return {
    write(secret) {
      try {
        writeSync(fd, `${secret}\n`);
      } finally {
        closeSync(fd);
      }
    },
    discard() {
      closeSync(fd);
      rmSync(path, { force: true });
    },
  };
}

/** Writes a secret to a new 0600 file at once (reserveSecretFile, then write). */
export function writeSecretFile(path: string, secret: string): void {
  reserveSecretFile(path).write(secret);
}
