import { readFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { resolve } from "node:path";
import { fileURLToPath } from "node:url";
import ts from "typescript";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type CallMeaning, KubeClient } from "../../src/broker/kubernetes/client";
import { type RenderedObject, renderBase } from "./kubernetes-render";

// The Role in deploy/kubernetes/role.yaml must grant exactly what the sandbox0 broker asks of the
// API server. What it asks is derived, not listed: every call of a KubeClient method in src/broker
// is found with the TypeScript checker (whatever the receiver is named), replayed with its own
// resource arguments on the real client, and the requests the client sends are turned into RBAC
// verbs by the API server's rule (GET of a name → get, of a collection → list, POST → create,
// PUT → update, PATCH → patch, DELETE → delete). REST requests go to a loopback server; an exec is
// a WebSocket upgrade, which Node's fetch will not send, so it is recorded at fetch itself.

const SRC = `${fileURLToPath(new URL("../../src", import.meta.url))}/`;
const CLIENT = fileURLToPath(new URL("../../src/broker/kubernetes/client.ts", import.meta.url));

interface CallSite {
  method: string;
  /** Constant string arguments by position (null where the argument is not a constant). */
  literals: Array<string | null>;
  /** For call/patch: the constant arguments of the `path(...)` call given as the path. */
  path?: Array<string | null>;
  where: string;
}

let found: CallSite[] | undefined;

/** Every call of a KubeClient method in src/ outside the client itself (one program, kept). */
function brokerCallSites(): CallSite[] {
  found ??= findCallSites();
  return found;
}

function findCallSites(): CallSite[] {
  const files = ts.sys.readDirectory(SRC, [".ts", ".tsx"], undefined, ["**/*"]);
  const program = ts.createProgram(files, {
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.ESNext,
    moduleResolution: ts.ModuleResolutionKind.Bundler,
    jsx: ts.JsxEmit.ReactJSX,
    jsxImportSource: "hono/jsx",
    noEmit: true,
    skipLibCheck: true,
    types: [],
  });
  const checker = program.getTypeChecker();
  const isKubeClient = (node: ts.Expression) => {
    const symbol = checker.getTypeAtLocation(node).getSymbol();
    return (
      symbol?.getName() === "KubeClient" &&
      symbol.getDeclarations()?.some((d) => d.getSourceFile().fileName === CLIENT) === true
    );
  };
  const constant = (node: ts.Expression | undefined): string | null => {
    if (!node) return null;
    const type = checker.getTypeAtLocation(node);
    return type.isStringLiteral() ? type.value : null;
  };
  const sites: CallSite[] = [];
  for (const file of program.getSourceFiles()) {
    if (!file.fileName.startsWith(SRC) || file.fileName === CLIENT) continue;
    const visit = (node: ts.Node) => {
      if (
        ts.isCallExpression(node) &&
        ts.isPropertyAccessExpression(node.expression) &&
        isKubeClient(node.expression.expression)
      ) {
        const method = node.expression.name.text;
        const { line } = file.getLineAndCharacterOfPosition(node.getStart());
        const site: CallSite = {
          method,
          literals: node.arguments.map((a) => constant(a)),
          where: `${file.fileName.slice(SRC.length)}:${line + 1}`,
        };
        const pathArg = node.arguments[method === "call" ? 1 : 0];
        if (
          (method === "call" || method === "patch") &&
          pathArg &&
          ts.isCallExpression(pathArg) &&
          ts.isPropertyAccessExpression(pathArg.expression) &&
          pathArg.expression.name.text === "path" &&
          isKubeClient(pathArg.expression.expression)
        ) {
          site.path = [0, 1, 2].map((i) => (pathArg.arguments[i] ? constant(pathArg.arguments[i]) : null));
          if (pathArg.arguments[1] && site.path[1] === null) site.path[1] = "<name>";
        }
        sites.push(site);
      }
      ts.forEachChild(node, visit);
    };
    visit(file);
  }
  return sites;
}

/** KubeClient's methods and getters that are not private: each a way a caller may reach the API. */
function publicMembers(): string[] {
  const file = ts.createSourceFile(CLIENT, readFileSync(CLIENT, "utf8"), ts.ScriptTarget.ES2022);
  const members: string[] = [];
  ts.forEachChild(file, (node) => {
    if (!ts.isClassDeclaration(node) || node.name?.text !== "KubeClient") return;
    for (const m of node.members) {
      if (ts.isConstructorDeclaration(m) || !m.name || !ts.isIdentifier(m.name)) continue;
      const hidden = ts.getCombinedModifierFlags(m) & (ts.ModifierFlags.Private | ts.ModifierFlags.Protected);
      if (!hidden) members.push(m.name.text);
    }
  });
  return members;
}

interface Sent {
  method: string;
  url: URL;
  upgrade: boolean;
}

const MEANING: CallMeaning = { what: "derive the broker's verbs" };
const NAME = "bw-derived";

/**
 * How each KubeClient method is replayed from a call site's constant arguments. A method missing
 * here fails the test: a new way of calling the API needs its replay written before it ships.
 */
const REPLAY: Record<string, (kube: KubeClient, site: CallSite) => Promise<unknown> | null> = {
  create: (kube, s) => kube.create(resourceOf(s), {}, MEANING),
  get: (kube, s) => kube.get(resourceOf(s), NAME, MEANING),
  replace: (kube, s) => kube.replace(resourceOf(s), NAME, {}, MEANING),
  remove: (kube, s) => kube.remove(resourceOf(s), NAME, MEANING),
  list: (kube, s) => kube.list(resourceOf(s), "a=b", MEANING),
  log: (kube) => kube.log(NAME, "proxy", 1, MEANING),
  exec: (kube) => kube.exec(NAME, "work", ["true"], { timeoutMs: 1000 }, MEANING),
  execBytes: (kube) => kube.execBytes(NAME, "work", ["true"], { timeoutMs: 1000 }, MEANING),
  call: (kube, s) => kube.call(must(s, s.literals[0], "its HTTP method"), pathOf(kube, s), MEANING),
  patch: (kube, s) => kube.patch(pathOf(kube, s), {}, "application/merge-patch+json", MEANING),
  // Build no request.
  path: () => null,
  namespace: () => null,
};

function must(site: CallSite, value: string | null | undefined, what: string): string {
  if (typeof value !== "string") {
    throw new Error(
      `${site.where}: ${site.method}'s ${what} is not a constant, so its RBAC verb cannot be derived`,
    );
  }
  return value;
}

const resourceOf = (site: CallSite) => must(site, site.literals[0], "resource");

function pathOf(kube: KubeClient, site: CallSite): string {
  if (!site.path) throw new Error(`${site.where}: ${site.method}'s path is not a kube.path(...) call`);
  const [resource, name, sub] = site.path;
  return kube.path(must(site, resource, "resource"), name === null ? undefined : NAME, sub ?? undefined);
}

/** The API server's request-to-verb rule (k8s.io/apiserver RequestInfo) for one request. */
function rbacOf(sent: Sent): string[] {
  const parts = sent.url.pathname.split("/").filter(Boolean);
  const group = parts[0] === "api" ? "" : (parts[1] ?? "");
  const rest = parts.slice(parts[0] === "api" ? 2 : 3);
  expect(rest[0], sent.url.pathname).toBe("namespaces");
  const [, , resource, name, sub] = rest;
  const target = `${group}/${resource}${sub ? `/${sub}` : ""}`;
  const verb = {
    GET: name ? "get" : "list",
    POST: "create",
    PUT: "update",
    PATCH: "patch",
    DELETE: name ? "delete" : "deletecollection",
  }[sent.method];
  if (!verb) throw new Error(`no RBAC verb for ${sent.method}`);
  // A WebSocket upgrade (exec) is a GET; newer API servers also check `create` for it
  // (AuthorizePodWebsocketUpgradeCreatePermission), so the broker needs both.
  return sent.upgrade ? [`${target}:get`, `${target}:create`] : [`${target}:${verb}`];
}

/** The rules of the rendered Role as `group/resource:verb` strings. */
function grantedBy(role: RenderedObject): string[] {
  const rules = role.rules as Array<{ apiGroups: string[]; resources: string[]; verbs: string[] }>;
  return rules.flatMap((r) =>
    r.apiGroups.flatMap((g) => r.resources.flatMap((res) => r.verbs.map((v) => `${g}/${res}:${v}`))),
  );
}

describe("the broker's Role", () => {
  let server: Server;
  let sent: Sent[] = [];
  let kube: KubeClient;
  const realFetch = globalThis.fetch;

  beforeAll(async () => {
    // Answers every REST request as the API server would answer a success of its kind.
    server = createServer((req, res) => {
      res.setHeader("content-type", "application/json");
      res.end(req.method === "GET" && !req.url?.includes("/log") ? '{"items":[]}' : "{}");
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as AddressInfo;
    kube = new KubeClient({
      apiUrl: `http://127.0.0.1:${port}`,
      token: "derive-token",
      namespace: "benchwright",
    });
    globalThis.fetch = async (input: Parameters<typeof fetch>[0], init?: RequestInit) => {
      const headers = new Headers(init?.headers);
      sent.push({
        method: init?.method ?? "GET",
        url: new URL(String(input)),
        upgrade: headers.get("upgrade") === "websocket",
      });
      return realFetch(input, init);
    };
  });

  afterAll(async () => {
    globalThis.fetch = realFetch;
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });

  /** The `group/resource:verb` set the broker's calls need. */
  async function derived(): Promise<Set<string>> {
    const needed = new Set<string>();
    for (const site of brokerCallSites()) {
      const replay = REPLAY[site.method];
      if (!replay) throw new Error(`${site.where}: KubeClient.${site.method} has no replay in this test`);
      sent = [];
      // An exec fails at fetch (see above), after its request was recorded.
      await Promise.resolve(replay(kube, site)).catch(() => {});
      if (site.method !== "path" && site.method !== "namespace") {
        expect(sent.length, `${site.where}: ${site.method} sent no request`).toBeGreaterThan(0);
      }
      for (const s of sent) for (const grant of rbacOf(s)) needed.add(grant);
    }
    return needed;
  }

  // The first test builds the TypeScript program of src/ (tens of seconds on a busy machine).
  it("grants exactly the verbs the broker's calls need, no more and no fewer", {
    timeout: 180_000,
  }, async () => {
    const needed = await derived();
    const role = renderBase().find((o) => o.kind === "Role" && o.metadata.name === "benchwright-broker");
    expect(role, "deploy/kubernetes renders the Role benchwright-broker").toBeDefined();
    const granted = grantedBy(role as RenderedObject);
    expect(new Set(granted).size, "a grant listed twice").toBe(granted.length);
    expect([...granted].sort()).toEqual([...needed].sort());
    // The broker never reads a Secret back (the proxy's credentials, pull credentials).
    expect(granted.filter((g) => g.startsWith("/secrets:"))).not.toContain("/secrets:get");
  });

  it("finds the broker's calls wherever its client is held, and knows every client method", () => {
    const sites = brokerCallSites();
    const where = new Set(sites.map((s) => s.where.split(":")[0]));
    // The client is held as `kube` in pods.ts and as `cluster.kube` elsewhere: both are found.
    expect([...where].sort()).toEqual(
      expect.arrayContaining([
        "broker/sandbox0/backend.ts",
        "broker/sandbox0/pods.ts",
        "broker/sandbox0/setup-images.ts",
      ]),
    );
    expect(publicMembers().length).toBeGreaterThan(5);
    expect(publicMembers().filter((m) => !(m in REPLAY))).toEqual([]);
  });

  it("has no other way to the API server than its client", () => {
    // A request built by hand elsewhere would escape the derivation above.
    for (const file of ts.sys.readDirectory(SRC, [".ts", ".tsx"], undefined, ["**/*"])) {
      if (resolve(file) === CLIENT) continue;
      const text = readFileSync(file, "utf8");
      expect(/["'`]\/apis?\/(v1|[a-z0-9.-]+\.k8s\.io)\b|\/namespaces\/\$\{/.test(text), file).toBe(false);
    }
  });
});
