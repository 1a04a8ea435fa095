import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import {
  CASES_DOC,
  checkAttackCases,
  citations,
  citedIds,
  parseCaseIds,
  testFiles,
  uncited,
} from "../../scripts/attack-cases";

// Issue 10: every attack case of docs/attack-cases.md has a test citing it as `case <ID>`.
// The same check runs in `npm run check` (scripts/attack-cases.ts). The synthetic ids below are
// Z-ids on purpose: this file must not cite a real case it does not test.

const ids = parseCaseIds(readFileSync(CASES_DOC, "utf8"));

describe("attack cases", () => {
  it("every case of docs/attack-cases.md is cited by a test", () => {
    const missing = uncited(citations(ids, testFiles()));
    expect(missing, `no test cites (write "// case <ID>" at the test): ${missing.join(", ")}`).toEqual([]);
  });

  it("the document holds the floor's 45 cases, A1–A17, B1–B9, C1–C4, D1–D5, E1–E7, F1–F3", () => {
    const expected = Object.entries({ A: 17, B: 9, C: 4, D: 5, E: 7, F: 3 }).flatMap(([letter, n]) =>
      Array.from({ length: n }, (_, i) => `${letter}${i + 1}`),
    );
    expect(expected).toHaveLength(45);
    expect(ids.filter((id) => "ABCDEF".includes(id[0] as string))).toEqual(expected);
  });

  it("a file without the strict citation is reported missing; with it, found", () => {
    const synthetic = ["Z9", "Z10"];
    const files = (text: string) => [{ path: "test/fake.test.ts", text }];
    const without = 'it("Z9: refuses it", () => {}); // cases Z9–Z10; case Z10 is elsewhere';
    expect(uncited(citations(synthetic, files(without)))).toEqual(["Z9"]);
    const withIt = '// case Z9\nit("refuses it", () => {});\nit("Case Z10: too", () => {});';
    expect(uncited(citations(synthetic, files(withIt)))).toEqual([]);
    expect(citations(synthetic, files(withIt)).get("Z9")).toEqual(["test/fake.test.ts"]);
  });

  it("only `case <ID>` counts: no lists, no ranges, no bare ids, no prefix of a longer id", () => {
    expect([...citedIds("case Z6, Z1, Z2")]).toEqual(["Z6"]);
    expect([...citedIds('Cases Z1–Z6; id: "Z1"; (Z1); showcase Z1; case z1')]).toEqual([]);
    expect([...citedIds("// case Z12: and CASE Z3.")]).toEqual(["Z12", "Z3"]);
    expect(citedIds("case Z12").has("Z1")).toBe(false);
  });

  it("fails when the copy lacks a case of ../shared/attack-cases.md, or rewords one", () => {
    const dir = mkdtempSync(join(tmpdir(), "bw-attack-cases-"));
    try {
      const doc = join(dir, "attack-cases.md");
      const shared = join(dir, "shared.md");
      const text = "## Z. Synthetic\n- Z9 A case.\n";
      writeFileSync(doc, text);
      const files = [{ path: "test/fake.test.ts", text: "// case Z9" }];
      writeFileSync(shared, text);
      expect(checkAttackCases({ doc, shared, files }).error).toBeNull();
      writeFileSync(shared, `${text}- Z10 Another.\n`);
      expect(checkAttackCases({ doc, shared, files }).error).toMatch(/lacks cases .*: Z10 \(copy/);
      writeFileSync(shared, "## Z. Synthetic\n- Z9 A case, reworded.\n");
      expect(checkAttackCases({ doc, shared, files }).error).toMatch(/: Z9 \(copy/);
      // More cases in the copy than in the floor (the open issues' cases, covered): fine, once cited.
      writeFileSync(shared, text);
      writeFileSync(doc, `${text}\n## Y. Next\n- Y1 Covered.\n`);
      expect(checkAttackCases({ doc, shared, files }).error).toMatch(/have no test citing them .*: Y1$/);
      const both = [...files, { path: "test/y.test.ts", text: "// case Y1" }];
      expect(checkAttackCases({ doc, shared, files: both }).error).toBeNull();
      writeFileSync(doc, text);
      expect(checkAttackCases({ doc, shared: join(dir, "absent.md"), files })).toEqual({
        lines: ["1 cases, all cited in 1 test files"],
        error: null,
      });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
