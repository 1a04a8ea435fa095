// The demo benchmark's program (BENCHMARKS.demo, what `npm start` launches): calls the demo API
// host without a key, tries the blocked host, and prints what it saw as one JSON line: the names
// (never values) of its environment, and which of them hold the run's placeholders (case N1: the
// vault's DEMO_API_KEY arrives as a placeholder, which is not the key). No single
// quotes: it runs as `node -e '...'` under `sh -c`. The end-to-end tests' sandbox scripts start
// with the same `get` (test/e2e/harness.ts), so what they report reads like the demo's.

/** `get(url)`: `{ status, body }` (the body parsed when it is JSON), or `{ error }`; never throws. */
export const REPORTING_GET = `
const get = async (url) => {
  try {
    const res = await fetch(url);
    const text = await res.text();
    let body = null;
    try { body = JSON.parse(text); } catch {}
    return { status: res.status, body };
  } catch (e) {
    return { error: String(e.cause?.code ?? e.message) };
  }
};
`;

export const DEMO_SCRIPT = `${REPORTING_GET}(async () => {
  const api = await get("https://api.demo.test/v1/whoami");
  const blocked = await get("https://blocked.demo.test/");
  const envNames = Object.keys(process.env).sort();
  const placeholders = envNames.filter((n) => String(process.env[n]).startsWith("bw-placeholder-"));
  console.log(JSON.stringify({ demo: true, api, blocked, envNames, placeholders }));
})();
`;
