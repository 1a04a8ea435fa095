// `npm run images [-- --verbose] [proxy|e2b-proxy|e2b-work|work ...]`: builds the images of proxy-image/
// here, daemonless (scripts/lib/images.ts): the local Node base first if missing, then each image,
// one line per image with its time. Exit 1 when any image failed to build, naming it, with the
// end of its build's output; 2 when this machine cannot build (not root, no buildah).
import { buildahMissing } from "../local-agent/buildah";
import { buildImages, IMAGES, type ImageName } from "./lib/images";

const args = process.argv.slice(2);
const verbose = args.includes("--verbose");
const names = args.filter((a) => a !== "--verbose");
const unknown = names.filter((n) => !IMAGES.some((i) => i.name === n));
if (unknown.length > 0) {
  console.error(`unknown image ${unknown.join(", ")} (the images: ${IMAGES.map((i) => i.name).join(", ")})`);
  process.exit(2);
}
const missing = buildahMissing();
if (missing) {
  console.error(`cannot build the images here: ${missing}`);
  process.exit(2);
}

const { base, images } = await buildImages({
  only: names.length > 0 ? (names as ImageName[]) : undefined,
  verbose,
  log: (line) => console.log(line),
});
console.log(`base ${base.ref}: ${base.built ? "built" : "cached"} in ${base.seconds.toFixed(1)} s`);
for (const image of images) {
  console.log(`image ${image.tag}: ${image.ok ? "built" : "FAILED"} in ${image.seconds.toFixed(1)} s`);
}
const failed = images.filter((i) => !i.ok);
for (const image of failed) {
  if (!image.ok) console.error(`\nthe ${image.name} image (${image.tag}) did not build:\n${image.error}`);
}
if (failed.length > 0) process.exit(1);
