import { existsSync } from "node:fs";
import { type Browser, chromium } from "playwright-core";

// Debian's Chromium driven by playwright-core: never a browser Playwright downloads. The flags
// keep it from reaching out (this machine's network is closed; tests talk to loopback only).

export const CHROMIUM = "/usr/bin/chromium";

export const CHROMIUM_SKIP: string | null = existsSync(CHROMIUM)
  ? null
  : `${CHROMIUM} is missing (apt-get install chromium; .ci/run does)`;

export function launchChromium(): Promise<Browser> {
  return chromium.launch({
    executablePath: CHROMIUM,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--disable-dev-shm-usage",
    ],
  });
}
