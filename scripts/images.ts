// `npm run images [-- --verbose] [--push <registry>] [proxy|e2b-proxy|e2b-work|work ...]`: builds
// the images of proxy-image/ here, daemonless (scripts/lib/images.ts): the local Node base first if
// missing, then each image, one line per image with its time and size. With --push, then pushes
// each to <registry>/<name>, tagged by its content, and prints the reference by digest to deploy
// (scripts/lib/image-publish.ts; credentials from the containers auth file, never the command
// line). Exit 1 when any image failed to build (nothing is pushed then) or to push, naming it,
// with the end of its output; 2 on bad arguments or when this machine cannot build (not root, no
// buildah).
import { parseArgs } from "node:util";
import { buildahMissing } from "../local-agent/buildah";
import { megabytes, parseRegistry, pushImage } from "./lib/image-publish";
import { buildImages, IMAGES, type ImageName } from "./lib/images";

function usage(problem: string): never {
  console.error(
    `${problem}\nusage: npm run images -- [--verbose] [--push <registry>] [${IMAGES.map((i) => i.name).join("|")} ...]`,
  );
  process.exit(2);
}

function parse() {
  try {
    return parseArgs({
      args: process.argv.slice(2),
      options: { verbose: { type: "boolean", default: false }, push: { type: "string" } },
      allowPositionals: true,
    });
  } catch (e) {
    return usage((e as Error).message);
  }
}
const { values, positionals: names } = parse();
const unknown = names.filter((n) => !IMAGES.some((i) => i.name === n));
if (unknown.length > 0) usage(`unknown image ${unknown.join(", ")}`);
let registry: string | null = null;
if (values.push !== undefined) {
  const r = parseRegistry(values.push);
  if ("error" in r) usage(r.error);
  registry = r.registry;
}
const missing = buildahMissing();
if (missing) {
  console.error(`cannot build the images here: ${missing}`);
  process.exit(2);
}

const { base, images } = await buildImages({
  only: names.length > 0 ? (names as ImageName[]) : undefined,
  verbose: values.verbose,
  log: (line) => console.log(line),
});
console.log(`base ${base.ref}: ${base.built ? "built" : "cached"} in ${base.seconds.toFixed(1)} s`);
for (const image of images) {
  const size = image.ok ? `, ${megabytes(image.bytes)}` : "";
  console.log(`image ${image.tag}: ${image.ok ? "built" : "FAILED"} in ${image.seconds.toFixed(1)} s${size}`);
}
const failed = images.filter((i) => !i.ok);
for (const image of failed) {
  if (!image.ok) console.error(`\nthe ${image.name} image (${image.tag}) did not build:\n${image.error}`);
}
if (failed.length > 0) {
  if (registry) console.error(`\nnothing pushed to ${registry}: not every image built`);
  process.exit(1);
}

if (registry) {
  let pushFailed = false;
  for (const image of images) {
    const pushed = await pushImage(image.tag, registry);
    if (pushed.ok) {
      console.log(`pushed ${image.tag} as ${pushed.repository}:${pushed.tag}\n  ${pushed.reference}`);
    } else {
      pushFailed = true;
      console.error(
        `\nthe ${image.name} image (${image.tag}) was not pushed to ${registry}:\n${pushed.error}`,
      );
    }
  }
  if (pushFailed) process.exit(1);
}
