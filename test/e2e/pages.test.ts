import { mkdirSync } from "node:fs";
import { join } from "node:path";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, expect, it } from "vitest";
import { until } from "../until";
import { CHROMIUM_SKIP, launchChromium } from "./chromium";
import { describeE2e, type E2eOptions, newUser, waitForEnd } from "./harness";

// The pages in a real browser (Debian's Chromium through playwright-core) against the local Worker
// and a real local run: a new user logs in with an API key, adds a secret (its value never shown
// again), a rule and a block entry, sees the routing mode change, runs the demo, sees the denied
// host on the run page and in the recent blocked hosts, promotes it to allow and sees the entry.
// Screenshots go to test-results/screenshots/pages/ (those of docs/user-guide.md, "The pages",
// come from there).

const SHOTS = join("test-results", "screenshots", "pages");

async function start(): Promise<E2eOptions> {
  mkdirSync(SHOTS, { recursive: true });
  return { name: "bwt-e2p", index: 97 };
}

describeE2e("the pages, in a browser", { start, skip: CHROMIUM_SKIP }, (e) => {
  let browser: Browser;
  beforeAll(async () => {
    browser = await launchChromium();
  });
  afterAll(async () => {
    await browser?.close();
  });

  /** Everything the browser was shown so far, to hunt for the canary in. */
  const seen: string[] = [];
  async function shot(page: Page, name: string) {
    seen.push(await page.content());
    await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
  }

  it("takes a new user from login to a denied host promoted to allow, by clicking", async () => {
    const api = await newUser(e.stack.apiUrl);
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const base = e.stack.apiUrl;

    // Log in: the vault page sends us to the login form and back.
    await page.goto(`${base}/manage/vault`);
    expect(new URL(page.url()).pathname).toBe("/login");
    await page.fill('input[name="key"]', api.key);
    await shot(page, "01-login");
    await page.click('button[type="submit"]:has-text("Log in")');
    await page.waitForURL(`${base}/manage/vault`);
    await shot(page, "02-vault-empty");

    // A secret: its name and fingerprint are shown, its value never again.
    const secrets = page.locator('form[action="/manage/vault/secrets"]');
    await secrets.locator('input[name="name"]').fill("DEMO_KEY");
    await secrets.locator('input[name="value"]').fill(e.canary);
    await secrets.locator('button[type="submit"]').click();
    await page.waitForLoadState();
    expect(await page.content()).toContain("DEMO_KEY");
    expect(await page.content()).not.toContain(e.canary);

    // A rule injecting it for the demo API, and a block entry.
    const rules = page.locator('form[action="/manage/vault/rules"]');
    await rules.locator('input[name="host"]').fill("api.demo.test");
    await rules.locator('select[name="secret"]').selectOption("DEMO_KEY");
    await rules.locator('button[type="submit"]').click();
    await page.waitForLoadState();
    const hosts = page.locator('form[action="/manage/vault/hosts"]');
    await hosts.locator('input[name="pattern"]').fill("blocked.demo.test");
    await hosts.locator('select[name="action"]').selectOption("block");
    await hosts.locator('button[type="submit"]').click();
    await page.waitForLoadState();
    expect(await page.textContent("body")).toContain("api.demo.test");

    // The routing mode: default now; a block default makes it catch-all, with its warning.
    const mode = () => page.locator("#routing strong").first().textContent();
    expect(await mode()).toBe("default");
    const setDefault = async (to: "allow" | "block") => {
      const form = page.locator('form[action="/manage/vault/default"]');
      await form.locator('select[name="default"]').selectOption(to);
      await form.locator('button[type="submit"]').click();
      await page.waitForLoadState();
    };
    await setDefault("block");
    expect(await mode()).toBe("catch-all");
    expect(await page.locator("#routing .warning").count()).toBeGreaterThan(0);
    await shot(page, "03-vault-catch-all");
    await setDefault("allow");
    expect(await mode()).toBe("default");
    await shot(page, "04-vault");

    // The demo run (launched from the runs page), to its end, and its page.
    await page.goto(`${base}/runs`);
    await page.locator('form[action="/runs"][method="post"] button[type="submit"]').click();
    await page.waitForURL(/\/runs\/run_[a-z2-7]+/);
    const runId = new URL(page.url()).pathname.split("/").at(-1) ?? "";
    // While the page says the run moves, it reloads itself (a meta refresh: the pages run no script).
    const pill = await page.locator("#status .pill").first().textContent();
    const moving = !["lingering", "finished", "stopped", "failed"].includes(pill ?? "");
    expect(await page.locator('meta[http-equiv="refresh"]').count()).toBe(moving ? 1 : 0);
    const ended = await waitForEnd(api, runId);
    expect(ended).toMatchObject({ status: "finished", reason: "completed" });
    await loadRunPage(page, `${base}/runs/${runId}`);
    const denied = page.locator("#denied");
    expect(await denied.textContent()).toContain("blocked.demo.test");
    await shot(page, "05-run");
    // The timeline: a bar per phase the demo went through, its denied host marked; ended, no reload.
    const timeline = page.locator("#timeline");
    const phases = await timeline
      .locator("g.phase")
      .evaluateAll((gs) => gs.map((g) => g.getAttribute("data-phase")));
    expect(phases).toEqual(
      expect.arrayContaining(["vault", "proxy", "sandboxes", "wiring", "execute", "teardown"]),
    );
    expect(await timeline.locator("g.mark.denial").count()).toBeGreaterThan(0);
    expect(await page.locator('meta[http-equiv="refresh"]').count()).toBe(0);
    await timeline.screenshot({ path: join(SHOTS, "05-run-timeline.png") });

    // A dry run of allowing it against that run, before saving anything.
    await page.goto(`${base}/manage/vault`);
    const dry = page.locator('form[action="/manage/vault/dry-run"]');
    await dry.locator('input[name="runId"]').fill(runId);
    await dry.locator('input[name="pattern"]').fill("blocked.demo.test");
    await dry.locator('select[name="action"]').selectOption("allow");
    await dry.locator('button[type="submit"]').click();
    await page.waitForLoadState();
    expect(await page.locator("#dry-hosts").textContent()).toContain("blocked.demo.test");
    await shot(page, "06-dry-run");

    // The recent blocked hosts, account-wide: promote it, and the entry is an allow now.
    await page.goto(`${base}/manage/vault`);
    const recent = page.locator("#blocked");
    expect(await recent.textContent()).toContain("blocked.demo.test");
    await shot(page, "07-vault-blocked-hosts");
    // Today's column of the refusals per day holds the demo's refusal.
    const today = new Date().toISOString().slice(0, 10);
    const refusals = await recent.locator(`svg.per-day g[data-day="${today}"]`).getAttribute("data-refusals");
    expect(Number(refusals)).toBeGreaterThan(0);
    await recent.screenshot({ path: join(SHOTS, "07-vault-blocked-chart.png") });
    await recent
      .locator('form[action="/manage/vault/blocked-hosts/allow"] button[type="submit"]')
      .first()
      .click();
    await page.waitForLoadState();
    const entries = await api.call("GET", "/v1/vault/hosts");
    expect(
      entries.json.hosts.find((h: { pattern: string }) => h.pattern === "blocked.demo.test"),
    ).toMatchObject({ action: "allow" });
    await shot(page, "08-vault-promoted");

    // A run that lingers: its page's link shows the proxy's own view; then the run list.
    await page.goto(`${base}/runs`);
    const launch = page.locator('form[action="/runs"][method="post"]');
    await launch.locator('input[name="lingerSeconds"]').fill("600");
    await launch.locator('button[type="submit"]').click();
    await page.waitForURL(/\/runs\/run_[a-z2-7]+/);
    const lingering = new URL(page.url()).pathname.split("/").at(-1) ?? "";
    await until(
      "lingering",
      async () => (await api.call("GET", `/v1/runs/${lingering}`)).json.status === "lingering",
      60_000,
    );
    await loadRunPage(page, `${base}/runs/${lingering}`);
    await shot(page, "09-run-lingering");
    await page.click('a:has-text("Look at the proxy")');
    await page.waitForURL(`${base}/runs/${lingering}/proxy`);
    expect(await page.textContent("body")).toContain("api.demo.test");
    await shot(page, "10-proxy-view");
    await api.call("POST", `/v1/runs/${lingering}/cancel`);
    await waitForEnd(api, lingering);
    await page.goto(`${base}/runs`);
    await shot(page, "11-runs");

    // A 253-character host (the longest DNS name) does not widen the vault page.
    const long = `${Array.from({ length: 3 }, () => "a".repeat(63)).join(".")}.${"b".repeat(56)}.test`;
    expect(long).toHaveLength(253);
    await page.goto(`${base}/manage/vault`);
    const entry = page.locator('form[action="/manage/vault/hosts"]');
    await entry.locator('input[name="pattern"]').fill(long);
    await entry.locator('select[name="action"]').selectOption("block");
    await entry.locator('button[type="submit"]').click();
    await page.waitForLoadState();
    expect(await page.textContent("#hosts")).toContain(long.slice(0, 63));
    // A string: the page's globals are not in this file's (Node) types.
    const width = (await page.evaluate(
      "[document.documentElement.scrollWidth, document.documentElement.clientWidth]",
    )) as [number, number];
    expect(width[0], "the page is wider than the window").toBeLessThanOrEqual(width[1]);
    await shot(page, "12-vault-long-host");
    for (const html of seen) expect(html).not.toContain(e.canary);
    await page.close();
  });
});

/**
 * Loads a run's page that may still be refreshing itself: its meta refresh may be navigating at
 * this moment (on a busy machine it was, and a reload or goto then is aborted), so load it again
 * until a load is not cut short.
 */
async function loadRunPage(page: Page, url: string): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      await page.goto(url);
      return;
    } catch (error) {
      if (attempt >= 5 || !/ERR_ABORTED|interrupted by another navigation/.test(String(error))) throw error;
    }
  }
}
