import { env } from "cloudflare:workers";
import { and, eq, sql } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config";
import { idempotencyKeys } from "../../src/db/schema";
import { IDEMPOTENT_POSTS, WITHHELD_FROM_REPLAY } from "../../src/idempotency/routes";
import { storedAnswer } from "../../src/idempotency/store";
import { SHOWN_ONCE } from "../../src/idempotency/withheld";
import { type ApiResponse, call, newTenant, principal, type Tenant, withDb } from "./harness";
import { findNeedles, leakNeedles } from "./leaks";
import { newRun } from "./run-fixtures";

// Case L5: a credential an answer shows once (an API key, an egress-agent token and its command,
// a webhook's or a notification URL's signing secret) is never kept in the idempotency store, so
// a replay cannot show it again and the database holds no recoverable copy of it. The list of
// withheld fields (WITHHELD_FROM_REPLAY) is checked against the OpenAPI document: a field marked
// shown-once, described as shown once, or named like a credential in a covered POST's answer, and
// not withheld, fails here; so does a listed operation without a case below.

type Doc = {
  paths: Record<string, Record<string, Op>>;
  components: { schemas: Record<string, Schema> };
};
type Op = { responses: Record<string, { content?: Record<string, { schema: Schema }> }> };
type Schema = {
  $ref?: string;
  allOf?: Schema[];
  anyOf?: Schema[];
  oneOf?: Schema[];
  items?: Schema;
  properties?: Record<string, Schema>;
  description?: string;
  [SHOWN_ONCE]?: boolean;
};

interface Field {
  /** Dotted path from the answer's top level, `[]` for array items. */
  path: string;
  schema: Schema;
}

/** Every property of a schema, however deep ($ref, allOf/anyOf/oneOf and arrays followed). */
function fields(doc: Doc, schema: Schema | undefined, at = "", seen = new Set<string>()): Field[] {
  if (!schema) return [];
  if (schema.$ref) {
    const name = schema.$ref.replace("#/components/schemas/", "");
    if (seen.has(`${at}|${name}`)) return [];
    seen.add(`${at}|${name}`);
    return fields(doc, doc.components.schemas[name], at, seen);
  }
  const out: Field[] = [];
  for (const sub of [...(schema.allOf ?? []), ...(schema.anyOf ?? []), ...(schema.oneOf ?? [])]) {
    out.push(...fields(doc, sub, at, seen));
  }
  if (schema.items) out.push(...fields(doc, schema.items, `${at}[]`, seen));
  for (const [name, prop] of Object.entries(schema.properties ?? {})) {
    const path = at ? `${at}.${name}` : name;
    // A property may itself be a $ref with its description beside it: both count.
    out.push({ path, schema: prop });
    if (prop.$ref) {
      const target = doc.components.schemas[prop.$ref.replace("#/components/schemas/", "")];
      if (target) out.push({ path, schema: target });
    }
    out.push(...fields(doc, prop, path, seen));
  }
  return out;
}

const top = (path: string) => path.split(/[.[]/)[0] as string;

/** Property names that look like a credential, wherever they are. */
const CREDENTIAL_NAME =
  /^(key|token|secret|password|passphrase|credential)$|(Key|Token|Secret|Password|Credential)$/;

/** Credential-looking names in a covered POST's answer that are not credentials, and why. */
const NOT_CREDENTIALS: Record<string, string> = {
  "/v1/vault/rules secret": "the name of the vault secret the rule injects, never its value",
  "/v1/vault/models secret": "the name of the vault secret holding the provider key, never its value",
};

/** What a covered POST's answers (2xx) show once: the top-level fields to withhold, and why. */
function shownOnce(doc: Doc, path: string) {
  const found = new Map<string, string[]>();
  const add = (field: string, why: string) => found.set(top(field), [...(found.get(top(field)) ?? []), why]);
  for (const [status, res] of Object.entries(doc.paths[path]?.post?.responses ?? {})) {
    if (!status.startsWith("2")) continue;
    for (const f of fields(doc, res.content?.["application/json"]?.schema)) {
      const name = f.path.split(".").at(-1)?.replace("[]", "") ?? "";
      if (f.schema[SHOWN_ONCE] === true) add(f.path, `${f.path} is marked ${SHOWN_ONCE}`);
      if (/shown (only|once)/i.test(f.schema.description ?? ""))
        add(f.path, `${f.path} says it is shown once`);
      if (CREDENTIAL_NAME.test(name) && !(`${path} ${f.path}` in NOT_CREDENTIALS)) {
        add(f.path, `${f.path} is named like a credential`);
      }
    }
  }
  return found;
}

interface Request {
  /** The URL path, ids filled in. */
  url: string;
  body?: unknown;
  /** The credential values an answer of it shows. */
  credentials: (answer: ApiResponse["json"]) => string[];
}

/** One case per operation on the list: what is needed first, then the request to send twice. */
const CASES: Record<string, (t: Tenant) => Promise<Request>> = {
  "/v1/api-keys": async () => ({ url: "/v1/api-keys", body: { name: "l5" }, credentials: (a) => [a.key] }),
  "/v1/runs": async () => ({
    url: "/v1/runs",
    body: { commands: ["true"], egress: "local" },
    credentials: (a) => [a.egressAgent.token, a.egressAgent.command],
  }),
  "/v1/runs/{id}/egress-agent-token": async (t) => {
    const run = await newRun(t, { spec: { commands: ["true"], egress: "local" }, status: "running" });
    return { url: `/v1/runs/${run.id}/egress-agent-token`, credentials: (a) => [a.token, a.command] };
  },
  "/v1/webhooks": async () => ({
    url: "/v1/webhooks",
    body: { name: "l5", run: { commands: ["true"] } },
    credentials: (a) => [a.secret],
  }),
  "/v1/webhooks/{id}/rotate-secret": async (t) => {
    const made = await t.api("POST", "/v1/webhooks", { name: "l5", run: { commands: ["true"] } });
    return { url: `/v1/webhooks/${made.json.id}/rotate-secret`, credentials: (a) => [a.secret] };
  },
  "/v1/notifications": async () => ({
    url: "/v1/notifications",
    body: { url: "https://ci.example.com/l5" },
    credentials: (a) => [a.secret],
  }),
};

const post = (t: Tenant, r: Request, key: string) =>
  call(t.key, "POST", r.url, r.body, { "idempotency-key": key });

const newKey = () => `l5-${crypto.randomUUID()}`;

/** The stored row as Postgres has it (every column, as text), and its answer opened. */
async function storedRow(t: Tenant, key: string) {
  return withDb(async (db) => {
    const where = and(eq(idempotencyKeys.environmentId, t.environmentId), eq(idempotencyKeys.key, key));
    const [row] = await db.select().from(idempotencyKeys).where(where);
    if (!row) throw new Error(`no idempotency row for ${key}`);
    const raw = await db.execute(
      sql`select r::text as t from idempotency_keys r where environment_id = ${t.environmentId} and key = ${key}`,
    );
    const answer = await storedAnswer(loadConfig(env).keyRing, principal(t), row);
    if (!answer) throw new Error(`${key} has no stored answer`);
    return { rowText: (raw.rows[0] as { t: string }).t, answer };
  });
}

const without = (body: Record<string, unknown>, withheld: readonly string[]) =>
  Object.fromEntries(Object.entries(body).filter(([k]) => !withheld.includes(k)));

describe("case L5: shown-once credentials and the idempotency store", () => {
  it("case L5: the withheld list is the document's shown-once fields, and every entry has a case", async () => {
    const doc = (await call(null, "GET", "/v1/openapi.json")).json as Doc;
    const problems: string[] = [];
    for (const path of IDEMPOTENT_POSTS) {
      const found = shownOnce(doc, path);
      const listed = WITHHELD_FROM_REPLAY[path] ?? [];
      for (const [field, why] of found) {
        if (!listed.includes(field)) problems.push(`${path}: ${field} is not withheld (${why.join("; ")})`);
      }
      for (const field of listed) {
        if (!found.has(field)) problems.push(`${path}: ${field} is withheld but not marked ${SHOWN_ONCE}`);
        else if (!found.get(field)?.some((w) => w.includes(SHOWN_ONCE))) {
          problems.push(`${path}: ${field} is withheld but no field of it is marked ${SHOWN_ONCE}`);
        }
      }
      if (listed.length > 0 && !(path in CASES)) problems.push(`${path}: withheld, but no case in this file`);
    }
    for (const path of Object.keys(CASES)) {
      if (!(WITHHELD_FROM_REPLAY[path as keyof typeof WITHHELD_FROM_REPLAY] ?? []).length) {
        problems.push(`${path}: a case here, but nothing withheld`);
      }
    }
    for (const entry of Object.keys(NOT_CREDENTIALS)) {
      const [path, field] = entry.split(" ") as [string, string];
      const all = Object.values(doc.paths[path]?.post?.responses ?? {}).flatMap((r) =>
        fields(doc, r.content?.["application/json"]?.schema).map((f) => f.path),
      );
      if (!all.includes(field)) problems.push(`NOT_CREDENTIALS names ${entry}, which the document lacks`);
    }
    expect(problems).toEqual([]);
    // The document says so too: the replay's marker header on each such operation.
    for (const path of Object.keys(CASES)) {
      const responses = doc.paths[path]?.post?.responses ?? {};
      const ok = Object.entries(responses).find(([s]) => s.startsWith("2"))?.[1] as {
        headers?: Record<string, unknown>;
      };
      expect(Object.keys(ok?.headers ?? {}), path).toContain("Idempotent-Withheld");
    }
  });

  for (const [path, make] of Object.entries(CASES)) {
    it(`case L5: ${path}: the replay leaves the credential out, and the stored answer never held it`, async () => {
      const withheld = WITHHELD_FROM_REPLAY[path as keyof typeof WITHHELD_FROM_REPLAY] ?? [];
      const t = await newTenant();
      const key = newKey();
      const request = await make(t);
      const first = await post(t, request, key);
      expect(first.status, first.text).toBeLessThan(300);
      expect(first.headers.get("idempotent-withheld")).toBeNull();
      const credentials = request.credentials(first.json);
      for (const c of credentials) expect(typeof c === "string" && c.length > 20, path).toBe(true);
      for (const field of withheld) expect(first.json[field], field).toBeDefined();
      const needles = (await Promise.all(credentials.map(leakNeedles))).flat();

      const replay = await post(t, request, key);
      expect(replay.status).toBe(first.status);
      expect(replay.headers.get("idempotent-replayed")).toBe("true");
      // The marker: which fields were left out, so a client knows to get a new one.
      expect(replay.headers.get("idempotent-withheld")).toBe(withheld.join(", "));
      for (const field of withheld) expect(replay.json, field).not.toHaveProperty(field);
      expect(replay.json).toEqual(without(first.json, withheld));
      expect(findNeedles("the replay", `${replay.text}\n${[...replay.headers].join("\n")}`, needles)).toEqual(
        [],
      );

      // Postgres itself: the row as text, and the sealed answer opened with the key ring.
      const stored = await storedRow(t, key);
      expect(findNeedles("the stored row", stored.rowText, needles)).toEqual([]);
      expect(findNeedles("the stored answer", stored.answer.body, needles)).toEqual([]);
      expect(findNeedles("the stored headers", JSON.stringify(stored.answer.headers), needles)).toEqual([]);
      expect(JSON.parse(stored.answer.body)).toEqual(without(first.json, withheld));
    });
  }
});

describe("case L5: what a replay still does", () => {
  it("case L5: an answer that showed no credential is replayed whole, with no Idempotent-Withheld", async () => {
    const t = await newTenant();
    const key = newKey();
    const direct = { url: "/v1/runs", body: { commands: ["true"] }, credentials: () => [] };
    const first = await post(t, direct, key);
    expect(first.status, first.text).toBe(202);
    expect(first.json).not.toHaveProperty("egressAgent");
    const replay = await post(t, direct, key);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(replay.headers.get("idempotent-withheld")).toBeNull();
    expect(replay.text).toBe(first.text);
  });

  it("case L5: the replay of an agent token mints nothing: the first token still opens its run's policy", async () => {
    const t = await newTenant();
    const request = await (CASES["/v1/runs/{id}/egress-agent-token"] as (t: Tenant) => Promise<Request>)(t);
    const key = newKey();
    const first = await post(t, request, key);
    expect(first.status, first.text).toBe(201);
    const replay = await post(t, request, key);
    expect(replay.headers.get("idempotent-withheld")).toBe("token, command");
    const policy = await call(first.json.token, "GET", "/egress-agent/policy");
    expect(policy.status, policy.text).toBe(200);
  });
});
