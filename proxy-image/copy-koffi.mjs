// Copies the koffi package the proxy loads (original-dst.ts) next to the bundle, as
// dist/node_modules/koffi, with the prebuilt binary of this machine's Linux architecture only:
// the package ships every platform's (84 MB), the proxy needs one (5 MB). koffi stays outside the
// esbuild bundle because its binary is a .node file, loaded by path. Run by `npm run build:proxy`.
import { cpSync, mkdirSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const from = dirname(createRequire(join(here, "package.json")).resolve("koffi/package.json"));
const to = join(here, "dist", "node_modules", "koffi");
const triplet = `linux_${process.arch}`;
rmSync(to, { recursive: true, force: true });
mkdirSync(join(to, "build", "koffi"), { recursive: true });
for (const file of ["package.json", "index.js", "index.d.ts", "LICENSE.txt"])
  cpSync(join(from, file), join(to, file));
cpSync(join(from, "build", "koffi", triplet), join(to, "build", "koffi", triplet), { recursive: true });
