// Types for tldts's compiled suffix list (see public-suffix.ts): the package ships them under
// dist/types, not beside the CommonJS file that Node, esbuild and Vite all load.
declare module "tldts/dist/cjs/src/data/trie.js" {
  export * from "tldts/dist/types/src/data/trie";
}
