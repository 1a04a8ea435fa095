import { readFileSync } from "node:fs";
import { beforeAll, expect, it } from "vitest";
import { renderApiReference } from "../../scripts/lib/api-reference";
import type { OpenApiDocument } from "../../scripts/lib/api-reference-schema";
import { API_REFERENCE, openApiDocument } from "../../scripts/openapi";

// docs/api-reference.md is generated from the OpenAPI document createApp() serves and committed;
// a route that changes shape must regenerate it (npm run openapi). The document is built once
// (an esbuild bundle of the app) and shared by the checks below.

let doc: OpenApiDocument;
let rendered: string;

beforeAll(async () => {
  doc = (await openApiDocument()) as OpenApiDocument;
  rendered = renderApiReference(doc);
}, 60_000);

// Credential shapes this API and its users handle, and long opaque strings in general.
const SECRETISH: RegExp[] = [
  /\bbw_[A-Za-z0-9_-]{16,}/, // API keys
  /\bbwe_[A-Za-z0-9_-]{16,}/, // egress agent tokens
  /whsec_[A-Za-z0-9+/=]{16,}/, // webhook and audit secrets
  /\bsk-[A-Za-z0-9_-]{16,}/, // OpenAI / OpenRouter keys
  /\b(?:ghp|gho|ghs|github_pat)_[A-Za-z0-9_]{16,}/,
  /\bAKIA[0-9A-Z]{16}\b/,
  /Bearer [A-Za-z0-9._~+/-]{16,}/,
  /[A-Za-z0-9+/_-]{40,}/,
];

function secretish(text: string): string[] {
  return SECRETISH.flatMap((re) => text.match(new RegExp(re.source, "g")) ?? []);
}

const METHODS = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

function headings(markdown: string, level: string): string[] {
  return markdown
    .split("\n")
    .filter((l) => l.startsWith(`${level} `))
    .map((l) => l.slice(level.length + 1));
}

it("docs/api-reference.md matches the OpenAPI document createApp() serves", () => {
  expect(readFileSync(API_REFERENCE, "utf8") === rendered, "run npm run openapi").toBe(true);
});

it("has a heading for every path and method in the document", () => {
  const wanted = Object.entries(doc.paths ?? {}).flatMap(([path, item]) =>
    Object.keys(item)
      .filter((m) => METHODS.includes(m))
      .map((m) => `\`${m.toUpperCase()} ${path}\``),
  );
  expect(wanted.length).toBeGreaterThan(40);
  const have = new Set(headings(rendered, "###"));
  expect(wanted.filter((h) => !have.has(h))).toEqual([]);
  // Once each: an operation listed under two tags would be two headings with one anchor.
  expect(headings(rendered, "###").filter((h, i, all) => all.indexOf(h) !== i)).toEqual([]);
});

it("describes every component schema the document references in its Schemas section", () => {
  const referenced = new Set<string>();
  const walk = (v: unknown): void => {
    if (Array.isArray(v)) v.forEach(walk);
    else if (v && typeof v === "object") {
      for (const [k, x] of Object.entries(v)) {
        if (k === "$ref" && typeof x === "string") referenced.add(x.replace("#/components/schemas/", ""));
        else walk(x);
      }
    }
  };
  walk(doc.paths);
  walk(doc.components?.schemas);
  expect(referenced.size).toBeGreaterThan(10);
  const section = rendered.slice(rendered.indexOf("\n## Schemas\n"));
  expect(section.length).toBeLessThan(rendered.length);
  const described = new Set(headings(section, "###").map((h) => h.replaceAll("`", "")));
  expect([...referenced].filter((name) => !described.has(name)).sort()).toEqual([]);
  // Alphabetical, so adding a schema moves nothing else.
  expect([...described]).toEqual([...described].sort());
});

it("every in-page link points at a heading (GitHub's anchors)", () => {
  const seen = new Map<string, number>();
  const anchors = new Set<string>();
  for (const line of rendered.split("\n")) {
    const h = /^#{1,6} (.*)$/.exec(line);
    if (!h?.[1]) continue;
    const base = h[1]
      .toLowerCase()
      .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, "")
      .replace(/ /g, "-");
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  const links = [...rendered.matchAll(/\]\(#([^)]+)\)/g)].map((m) => m[1] as string);
  expect(links.length).toBeGreaterThan(100);
  expect([...new Set(links)].filter((a) => !anchors.has(a))).toEqual([]);
});

it("shows no secret-ish value: no example or default on a secret field, no credential shapes", () => {
  const offenders: string[] = [];
  const walk = (v: unknown, at: string): void => {
    if (Array.isArray(v)) {
      for (const [i, x] of v.entries()) walk(x, `${at}[${i}]`);
    } else if (v && typeof v === "object") {
      const o = v as Record<string, unknown>;
      if (o.properties && typeof o.properties === "object") {
        for (const [name, p] of Object.entries(o.properties as Record<string, Record<string, unknown>>)) {
          const secretField = /^(value|token|password|api_?key|key)$/i.test(name);
          if (secretField && (p.example !== undefined || p.default !== undefined))
            offenders.push(`${at}.${name}`);
        }
      }
      for (const [k, x] of Object.entries(o)) walk(x, `${at}.${k}`);
    }
  };
  walk(doc, "$");
  expect(offenders).toEqual([]);
  expect(secretish(rendered)).toEqual([]);

  // The detector itself: a key planted as an example is caught once rendered.
  const planted: OpenApiDocument = {
    paths: {
      "/v1/x": {
        post: {
          requestBody: {
            content: {
              "application/json": {
                schema: {
                  type: "object",
                  properties: { k: { type: "string", example: "sk-or-v1-0123456789abcdef0123" } },
                },
              },
            },
          },
        },
      },
    },
  };
  expect(secretish(renderApiReference(planted))).toEqual(["sk-or-v1-0123456789abcdef0123"]);
});

// One casing for the whole API: camelCase for every field and parameter, and an operationId
// (camelCase verb + noun: listRuns, getRun, createRun, revokeApiKey...) on every operation, unique,
// so a generated client names its methods from the document. The only names let through are
// those we do not choose, each with its reason.
const CAMEL_CASE = /^[a-z][a-zA-Z0-9]*$/;
const NOT_CAMEL_CASE: Readonly<Record<string, string>> = {
  "header idempotency-key": "an HTTP header: header names are hyphenated by convention (Idempotency-Key)",
};

/** What breaks the naming rule (where, and what), and which exceptions the document used. */
function namingProblems(document: OpenApiDocument): { offenders: string[]; excepted: string[] } {
  const offenders: string[] = [];
  const excepted = new Set<string>();
  const check = (kind: string, name: string, at: string) => {
    if (CAMEL_CASE.test(name)) return;
    if (NOT_CAMEL_CASE[`${kind} ${name}`] !== undefined) excepted.add(`${kind} ${name}`);
    else offenders.push(`${at}: ${kind} ${name}`);
  };
  const walk = (v: unknown, at: string): void => {
    if (Array.isArray(v)) {
      for (const [i, x] of v.entries()) walk(x, `${at}[${i}]`);
    } else if (v && typeof v === "object") {
      const o = v as Record<string, unknown>;
      if (o.properties && typeof o.properties === "object" && !Array.isArray(o.properties)) {
        for (const name of Object.keys(o.properties)) check("property", name, at);
      }
      for (const [k, x] of Object.entries(o)) walk(x, `${at}.${k}`);
    }
  };
  const ids = new Map<string, string>();
  for (const [path, item] of Object.entries(document.paths ?? {})) {
    for (const [method, op] of Object.entries(item)) {
      if (!METHODS.includes(method)) continue;
      const o = op as { operationId?: string; parameters?: { name: string; in: string }[] };
      const at = `${method.toUpperCase()} ${path}`;
      if (o.operationId === undefined) offenders.push(`${at}: no operationId`);
      else {
        check("operationId", o.operationId, at);
        const other = ids.get(o.operationId);
        if (other) offenders.push(`${at}: operationId ${o.operationId} is also ${other}'s`);
        ids.set(o.operationId, at);
      }
      for (const p of o.parameters ?? []) check(p.in, p.name, at);
    }
    walk(item, path);
  }
  walk(document.components, "components");
  return { offenders, excepted: [...excepted].sort() };
}

it("names every operation (a unique camelCase operationId) and every field and parameter in camelCase", () => {
  const { offenders, excepted } = namingProblems(doc);
  expect(offenders).toEqual([]);
  // An exception the document no longer needs goes from the list.
  expect(excepted).toEqual(Object.keys(NOT_CAMEL_CASE).sort());

  // The check itself: a snake_case field however deep, a missing id and a repeated one are caught.
  const planted = structuredClone(doc);
  const runSpec = planted.components?.schemas?.RunSpec as { properties: Record<string, unknown> };
  runSpec.properties.model_budget = { type: "object", properties: { input_tokens: { type: "integer" } } };
  const ops = planted.paths?.["/v1/runs"] as Record<string, { operationId?: string }>;
  delete (ops.post as { operationId?: string }).operationId;
  (ops.get as { operationId?: string }).operationId = "getRun";
  expect(namingProblems(planted).offenders).toEqual([
    "POST /v1/runs: no operationId",
    "GET /v1/runs/{id}: operationId getRun is also GET /v1/runs's",
    "components.schemas.RunSpec: property model_budget",
    "components.schemas.RunSpec.properties.model_budget: property input_tokens",
  ]);
});
