import { describe, expect, it } from "vitest";
import { needlesFor, RedactStream } from "../../proxy-image/src/proxy/redact";

// Case B7 for streamed bodies: a secret split across chunks at any point is still masked, and
// only an end that could start a secret form is held back, so what cannot be a secret flows at
// once (an interactive stream is not held up). Pure: no sockets.

const SECRET = "sk-canary-stream-91e0c4";
const needles = needlesFor(SECRET, `Bearer ${SECRET}`);

/** Writes the chunks one by one; returns what came out after each write, and in all. */
function run(chunks: string[]): { after: string[]; all: string } {
  const s = new RedactStream(needles);
  let out = "";
  s.on("data", (c: Buffer) => {
    out += c.toString("latin1");
  });
  const after: string[] = [];
  for (const c of chunks) {
    s.write(Buffer.from(c, "latin1"));
    after.push(out);
  }
  s.end();
  return { after, all: out };
}

describe("case B7: the streamed scrubber", () => {
  const text = `{"auth":"Bearer ${SECRET}","again":"${SECRET}"}`;
  const masked = text.replaceAll(SECRET, "*".repeat(SECRET.length));

  it("masks a secret split at every position, and in one-byte chunks", () => {
    for (let i = 1; i < text.length; i++) {
      expect(run([text.slice(0, i), text.slice(i)]).all, `split at ${i}`).toBe(masked);
    }
    expect(run([...text]).all).toBe(masked);
  });

  it("passes at once what cannot start a secret form; holds only a possible start", () => {
    expect(run(['{"say":"hello"}']).after).toEqual(['{"say":"hello"}']);
    // "Bear" could be the start of the injected form, "sk-ca" of the secret: held until the next
    // chunk shows what they are.
    const held = run(["one Bear", "d two sk-ca", "mera"]);
    expect(held.after).toEqual(["one ", "one Beard two ", "one Beard two sk-camera"]);
  });
});
