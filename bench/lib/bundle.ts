import type { BuildOptions } from "esbuild";

// The esbuild options of `npm run build:proxy` (package.json), for the bundles the benches build
// themselves: the proxy as the image runs it, and the minimal MITM built the same way. Keep the
// two in step; the proxy bench's memory rows are only the image's when they are.
export const UNMINIFIED_BUILD = {
  bundle: true,
  platform: "node",
  target: "node24",
  format: "cjs",
  // koffi's binary is loaded by path (build:proxy copies it beside the bundle; no direct listener
  // is benched, so none is needed here).
  external: ["koffi"],
  logLevel: "warning",
} as const satisfies BuildOptions;

// Whitespace and syntax minified (comments gone), identifiers left alone (stack traces and CPU
// profiles name functions as the source does), no legal comments, and esbuild's default ASCII
// charset: the bundle's text is then all one-byte characters, so V8 holds the source as a
// one-byte string. A single character above U+00FF (a kept comment's ’ or —, or --charset=utf8
// letting a string's é or ✓ through) makes it two bytes per character instead. Full --minify
// needs --keep-names for readable traces, and its per-function __name calls cost ~6 MiB of RSS
// at start (measured), more than mangled names save.
export const PROXY_BUILD = {
  ...UNMINIFIED_BUILD,
  minifyWhitespace: true,
  minifySyntax: true,
  legalComments: "none",
} as const satisfies BuildOptions;

/** The flags of PROXY_BUILD that package.json's build:proxy lacks (empty when in step). */
export function buildScriptDrift(packageJson: string): string[] {
  const script: string = JSON.parse(packageJson).scripts?.["build:proxy"] ?? "";
  const flags = ["--bundle", "--platform=node", "--target=node24", "--format=cjs", "--external:koffi"];
  flags.push("--minify-whitespace", "--minify-syntax", "--legal-comments=none");
  return flags.filter((flag) => !script.split(/\s+/).includes(flag));
}
