// `npm run e2b:templates [-- proxy|work]`: builds the E2B templates (both, or the one named)
// through E2B's template API from proxy-image/e2b*.Dockerfile (scripts/lib/e2b-templates.ts).
// The API key is E2B_API_KEY from the environment, never an argument, and is never printed.
// E2B_API_URL / E2B_DOMAIN point it at a self-hosted E2B (empty: E2B's cloud);
// E2B_PROXY_TEMPLATE / E2B_WORK_TEMPLATE rename the templates as they rename them for the Worker.
import { resolve } from "node:path";
import { buildE2bTemplates, E2B_TEMPLATES } from "./lib/e2b-templates";

const apiKey = process.env.E2B_API_KEY ?? "";
// The key is only ever replaced in what is printed, however an error came to carry it.
const redact = (text: string) => (apiKey ? text.split(apiKey).join("[E2B_API_KEY]") : text);

const wanted = process.argv.slice(2);
const known: string[] = E2B_TEMPLATES.map((t) => t.key);
if (wanted.some((w) => !known.includes(w))) {
  // Not echoed: a mistaken argument could be the key itself.
  console.error(`usage: npm run e2b:templates [-- ${known.join("|")}] (E2B_API_KEY in the environment)`);
  process.exit(2);
}
if (apiKey.length < 16) {
  console.error("E2B_API_KEY must be set in the environment (an E2B API key: e2b_…)");
  process.exit(2);
}

try {
  await buildE2bTemplates({
    root: resolve(import.meta.dirname, ".."),
    only: wanted.length > 0 ? wanted : undefined,
    connection: { apiKey, apiUrl: process.env.E2B_API_URL, domain: process.env.E2B_DOMAIN },
    names: {
      E2B_PROXY_TEMPLATE: process.env.E2B_PROXY_TEMPLATE,
      E2B_WORK_TEMPLATE: process.env.E2B_WORK_TEMPLATE,
    },
    log: (line) => console.log(redact(line)),
  });
} catch (e) {
  console.error(redact(`e2b:templates: ${(e as Error).message}`));
  process.exit(1);
}
