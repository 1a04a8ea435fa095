/// <reference path="./tldts-trie.d.ts" />
import {
  edgeChild,
  edgeLength,
  edgeStart,
  labelText,
  nodeFlags,
  rulesRoot,
} from "tldts/dist/cjs/src/data/trie.js";

// "Is there a public-suffix-list entry below R?" (case I8): `*.R` must not cover a suffix where
// anyone can host (`*.amazonaws.com` covers `execute-api.<region>.amazonaws.com`). tldts answers
// what the suffix of a given name is, never which entries lie under a name, so this walks tldts's
// own compiled list (the same data, ICANN and private sections, its exact pinned version that
// parse() reads) instead of shipping a second copy of the list. The layout is tldts's internal
// one: a flat trie keyed right to left, a node's edges contiguous in edgeStart, edge labels
// concatenated in labelText in edge order; test/unit/policy-host.test.ts pins known answers, so
// a tldts upgrade that changes the layout fails there rather than silently answering "none".
// The CommonJS file, because it is the one path Node (scripts that bundle the app with
// node_modules external), esbuild and Vite all load; an ESM bundle of the Worker may so carry
// the list twice (about 100 KB).

let edgeOffsets: Uint32Array | null = null;

function offsets(): Uint32Array {
  if (edgeOffsets === null) {
    edgeOffsets = new Uint32Array(edgeLength.length + 1);
    for (let e = 0; e < edgeLength.length; e++)
      edgeOffsets[e + 1] = (edgeOffsets[e] ?? 0) + (edgeLength[e] ?? 0);
  }
  return edgeOffsets;
}

const labelOf = (edge: number): string => {
  const at = offsets()[edge] ?? 0;
  return labelText.slice(at, at + (edgeLength[edge] ?? 0));
};

function child(node: number, label: string): number | null {
  let wildcard: number | null = null;
  for (let e = edgeStart[node] ?? 0; e < (edgeStart[node + 1] ?? 0); e++) {
    const l = labelOf(e);
    if (l === label) return edgeChild[e] ?? null;
    if (l === "*") wildcard = edgeChild[e] ?? null;
  }
  return wildcard;
}

/**
 * One entry of the public suffix list (either section) strictly below `domain` (a canonical
 * lowercase name), e.g. `execute-api.us-east-1.amazonaws.com` for `amazonaws.com`; null if none.
 */
export function suffixEntryBelow(domain: string): string | null {
  let node: number | null = rulesRoot;
  for (const label of domain.split(".").reverse()) {
    node = child(node, label);
    if (node === null) return null;
  }
  // Depth first, to the first node that is an entry (flag set); nodes exist only on paths to one.
  const stack: Array<[number, string]> = [];
  const push = (from: number, suffix: string) => {
    for (let e = (edgeStart[from + 1] ?? 0) - 1; e >= (edgeStart[from] ?? 0); e--) {
      stack.push([edgeChild[e] ?? 0, `${labelOf(e)}.${suffix}`]);
    }
  };
  push(node, domain);
  for (let next = stack.pop(); next !== undefined; next = stack.pop()) {
    const [at, name] = next;
    if ((nodeFlags[at] ?? 0) !== 0) return name;
    push(at, name);
  }
  return null;
}
