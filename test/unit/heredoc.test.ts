import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { expandCopyHeredocs } from "../../scripts/lib/heredoc";

// The rewrite of COPY heredocs for a buildah that predates them (scripts/lib/heredoc.ts): the
// rewritten Dockerfile copies files of exactly the heredocs' text, and nothing else changes.

describe("expandCopyHeredocs", () => {
  it("turns each COPY heredoc into a file and a COPY of it, flags and the rest kept", () => {
    const text = [
      "FROM x",
      "COPY --chmod=755 <<'EOF' /usr/local/bin/a",
      "#!/bin/sh",
      'echo "$1"',
      "EOF",
      "RUN true",
      'COPY <<"END" /b',
      "  indented",
      "",
      "END",
      "COPY <<-TABS /c",
      "\tno dollar here",
      "\tTABS",
      "",
    ].join("\n");
    const { dockerfile, files } = expandCopyHeredocs(text, ".images/heredoc/t");
    expect(dockerfile).toBe(
      [
        "FROM x",
        "COPY --chmod=755 .images/heredoc/t/1 /usr/local/bin/a",
        "RUN true",
        "COPY .images/heredoc/t/2 /b",
        "COPY .images/heredoc/t/3 /c",
        "",
      ].join("\n"),
    );
    expect([...files]).toEqual([
      [".images/heredoc/t/1", '#!/bin/sh\necho "$1"\n'],
      [".images/heredoc/t/2", "  indented\n\n"],
      [".images/heredoc/t/3", "no dollar here\n"],
    ]);
  });

  it("leaves a Dockerfile without heredocs as it is", () => {
    const text = readFileSync(new URL("../../proxy-image/Dockerfile", import.meta.url), "utf8");
    expect(expandCopyHeredocs(text, "d")).toEqual({ dockerfile: text, files: new Map() });
  });

  it("rewrites the work template's four scripts", () => {
    const text = readFileSync(new URL("../../proxy-image/e2b-work.Dockerfile", import.meta.url), "utf8");
    const { dockerfile, files } = expandCopyHeredocs(text, "d");
    expect(dockerfile).not.toContain("<<");
    expect(dockerfile).toContain("COPY --chmod=755 d/1 /usr/local/bin/bw-drop-root");
    expect([...files.values()].map((body) => body.split("\n")[0])).toEqual([
      "#!/bin/sh",
      "#!/bin/sh",
      "#!/bin/sh",
      "#!/bin/sh",
    ]);
  });

  it("refuses what it would get wrong", () => {
    expect(() => expandCopyHeredocs("COPY <<EOF /a\n$HOME\nEOF\n", "d")).toThrow(/unquoted heredoc/);
    expect(() => expandCopyHeredocs("COPY <<'EOF' /a\nnever closed\n", "d")).toThrow(/never closed/);
    expect(() => expandCopyHeredocs("RUN <<EOF\necho\nEOF\n", "d")).toThrow(/does not handle/);
  });
});
