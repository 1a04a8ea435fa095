// How the API reference writes one schema in Markdown: the OpenAPI types it reads, its type
// expressions with links, its tables and its headings' anchors (scripts/lib/api-reference.ts lays
// out the page). Hand-written for the reasons that file gives.

export interface Schema {
  $ref?: string;
  type?: string | string[];
  format?: string;
  description?: string;
  enum?: unknown[];
  const?: unknown;
  default?: unknown;
  example?: unknown;
  pattern?: string;
  minLength?: number;
  maxLength?: number;
  minimum?: number;
  maximum?: number;
  minItems?: number;
  maxItems?: number;
  properties?: Record<string, Schema>;
  required?: string[];
  additionalProperties?: boolean | Schema;
  items?: Schema;
  allOf?: Schema[];
  oneOf?: Schema[];
  anyOf?: Schema[];
}

export interface Parameter {
  $ref?: string;
  name: string;
  in: string;
  required?: boolean;
  description?: string;
  schema?: Schema;
}

export interface Content {
  [mediaType: string]: { schema?: Schema };
}

export interface Operation {
  operationId?: string;
  tags?: string[];
  summary?: string;
  description?: string;
  deprecated?: boolean;
  parameters?: Parameter[];
  requestBody?: { required?: boolean; description?: string; content?: Content };
  responses?: Record<string, { description?: string; content?: Content }>;
  security?: Record<string, string[]>[];
}

export interface OpenApiDocument {
  openapi?: string;
  info?: { title?: string; version?: string; description?: string };
  tags?: { name: string; description?: string }[];
  security?: Record<string, string[]>[];
  paths?: Record<string, Record<string, unknown>>;
  components?: {
    schemas?: Record<string, Schema>;
    parameters?: Record<string, Parameter>;
    securitySchemes?: Record<string, { type?: string; scheme?: string; name?: string; in?: string }>;
  };
}

export function operationHeading(method: string, path: string): string {
  return `\`${method.toUpperCase()} ${path}\``;
}

export function schemaHeading(name: string): string {
  return `\`${name}\``;
}

/** The component schema a `$ref` names, or undefined for refs elsewhere. */
function refName(ref: string): string | undefined {
  const m = /^#\/components\/schemas\/(.+)$/.exec(ref);
  return m?.[1]?.replace(/~1/g, "/").replace(/~0/g, "~");
}

// GitHub's heading anchors (github-slugger): lower case, punctuation dropped, spaces to hyphens,
// repeats numbered. Computed once over every heading so links and headings agree.
function slugger() {
  const seen = new Map<string, number>();
  return (text: string): string => {
    const base = text
      .toLowerCase()
      .replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, "")
      .replace(/ /g, "-");
    const n = seen.get(base);
    seen.set(base, (n ?? -1) + 1);
    return n === undefined ? base : `${base}-${n + 1}`;
  };
}

/** A Markdown code span around any text, backticks included. */
export function code(text: string): string {
  const longest = Math.max(0, ...(text.match(/`+/g) ?? []).map((run) => run.length));
  const fence = "`".repeat(longest + 1);
  const pad = text.startsWith("`") || text.endsWith("`") ? " " : "";
  return `${fence}${pad}${text}${pad}${fence}`;
}

/** One table cell: pipes escaped (GFM reads `\|` even inside code spans), one line. */
function cell(text: string): string {
  return text.replace(/\r?\n/g, " ").replace(/\|/g, "\\|");
}

export function table(head: string[], rows: string[][]): string[] {
  return [
    `| ${head.join(" | ")} |`,
    `|${head.map(() => "---").join("|")}|`,
    ...rows.map((r) => `| ${r.map(cell).join(" | ")} |`),
  ];
}

export function json(value: unknown): string {
  return JSON.stringify(value);
}

function range(min: number | undefined, max: number | undefined, unit: string): string | undefined {
  if (min !== undefined && max !== undefined)
    return min === max ? `exactly ${min}${unit}` : `${min}–${max}${unit}`;
  if (min !== undefined) return `≥ ${min}${unit}`;
  if (max !== undefined) return `≤ ${max}${unit}`;
  return undefined;
}

/** Only annotations (a description beside a $ref in allOf), no type of its own. */
function annotationOnly(s: Schema): boolean {
  return !(
    s.$ref ||
    s.type ||
    s.properties ||
    s.items ||
    s.enum ||
    s.const !== undefined ||
    s.allOf ||
    s.oneOf ||
    s.anyOf
  );
}

export function isInlineObject(s: Schema): boolean {
  return !s.$ref && s.properties !== undefined;
}

/** Type text: plain strings are code, `md` is Markdown (a link); adjacent code is one span. */
type Part = string | { md: string };

function joinParts(lists: Part[][], separator: string): Part[] {
  return lists.flatMap((list, i) => (i === 0 ? list : [separator, ...list]));
}

function render(parts: Part[]): string {
  let out = "";
  let pending = "";
  for (const p of parts) {
    if (typeof p === "string") {
      pending += p;
      continue;
    }
    if (pending) out += code(pending);
    pending = "";
    out += p.md;
  }
  return pending ? out + code(pending) : out;
}

export function types(s: Schema): string[] {
  return s.type === undefined ? [] : Array.isArray(s.type) ? s.type : [s.type];
}

export class Renderer {
  private readonly slugs = new Map<string, string>();

  constructor(private readonly doc: OpenApiDocument) {}

  /** Registers every heading in the order render() emits them, so forward links resolve. */
  assignSlugs(headings: { key: string; text: string }[]): void {
    const slug = slugger();
    for (const h of headings) this.slugs.set(h.key, slug(h.text));
  }

  anchor(key: string): string {
    const s = this.slugs.get(key);
    if (s === undefined) throw new Error(`no heading for ${key}`);
    return `#${s}`;
  }

  /** A link to a component schema, or its name when the document does not define it. */
  ref(ref: string): string {
    const name = refName(ref);
    if (name === undefined || !this.doc.components?.schemas?.[name]) return code(ref);
    return `[${name}](${this.anchor(`schema:${name}`)})`;
  }

  /** A compact, TypeScript-like type: one code span, broken only by links to schemas. */
  type(s: Schema | undefined): string {
    return render(this.parts(s));
  }

  private parts(s: Schema | undefined): Part[] {
    if (!s) return ["unknown"];
    if (s.$ref) {
      const name = refName(s.$ref);
      if (name === undefined || !this.doc.components?.schemas?.[name]) return [s.$ref];
      return [{ md: this.ref(s.$ref) }];
    }
    if (s.allOf) {
      const members = s.allOf.filter((m) => !annotationOnly(m));
      return members.length === 0
        ? ["unknown"]
        : joinParts(
            members.map((m) => this.parts(m)),
            " & ",
          );
    }
    const union = s.oneOf ?? s.anyOf;
    if (union)
      return joinParts(
        union.map((m) => this.parts(m)),
        " | ",
      );
    if (s.const !== undefined) return [json(s.const)];
    if (s.enum) return [s.enum.map(json).join(" | ")];
    const ts = types(s);
    if (ts.length === 0) return [s.properties ? "object" : "unknown"];
    return joinParts(
      ts.map((t) => this.namedParts(t, s)),
      " | ",
    );
  }

  private namedParts(t: string, s: Schema): Part[] {
    if (t === "array") {
      const item = s.items;
      if (!item) return ["unknown[]"];
      const inner = this.parts(item);
      const compound = item.oneOf || item.anyOf || item.allOf || item.enum || types(item).length > 1;
      return compound ? ["(", ...inner, ")[]"] : [...inner, "[]"];
    }
    if (t === "object") {
      // An inline object where a field table cannot go: `{ a: string; b?: number }`.
      if (s.properties) {
        const required = new Set(s.required ?? []);
        const fields = Object.entries(s.properties).map(([name, p]): Part[] => [
          `${name}${required.has(name) ? "" : "?"}: `,
          ...this.parts(p),
        ]);
        return ["{ ", ...joinParts(fields, "; "), " }"];
      }
      const extra = s.additionalProperties;
      if (extra && typeof extra === "object") return ["Record<string, ", ...this.parts(extra), ">"];
      return ["object"];
    }
    return [s.format && t !== "null" ? `${t} (${s.format})` : t];
  }

  /**
   * A small wrapper object (`{ rules: Rule[] }`) reads better as one type in a table cell than as
   * a table of its own: at most three fields, none with a description or constraint to show.
   */
  fitsInCell(s: Schema): boolean {
    if (!isInlineObject(s)) return false;
    const fields = Object.values(s.properties ?? {});
    return (
      fields.length <= 3 &&
      fields.every(
        (p) =>
          this.notes(p) === "" &&
          !isInlineObject(p) &&
          !(p.items && isInlineObject(p.items)) &&
          !(p.oneOf || p.anyOf || p.allOf),
      )
    );
  }

  /** Description, then constraints, default and example, for the last column of a table. */
  notes(s: Schema | undefined, description?: string): string {
    if (!s) return description ?? "";
    const out: string[] = [];
    const desc = description ?? s.description ?? s.allOf?.find((m) => m.description)?.description;
    if (desc) out.push(desc);
    out.push(...this.constraints(s));
    if (types(s).includes("array") && s.items && !s.items.$ref && !isInlineObject(s.items)) {
      const each = [s.items.description, ...this.constraints(s.items)].filter(Boolean);
      if (each.length > 0) out.push(`each item: ${each.join(", ")}`);
    }
    return out.join("; ");
  }

  private constraints(s: Schema): string[] {
    const out: string[] = [];
    const length = range(s.minLength, s.maxLength, " chars");
    if (length) out.push(length);
    const value = range(s.minimum, s.maximum, "");
    if (value) out.push(value);
    const count = range(s.minItems, s.maxItems, " items");
    if (count) out.push(count);
    if (s.pattern !== undefined) out.push(`pattern ${code(s.pattern)}`);
    if (s.default !== undefined) out.push(`default ${code(json(s.default))}`);
    if (s.example !== undefined) out.push(`example ${code(json(s.example))}`);
    return out;
  }

  /** Field rows of an object, nested inline objects as `a.b`, arrays of them as `a[].b`. */
  fieldRows(s: Schema, prefix = ""): string[][] {
    const rows: string[][] = [];
    const required = new Set(s.required ?? []);
    for (const [name, p] of Object.entries(s.properties ?? {})) {
      const field = `${prefix}${name}`;
      const nullable = types(p).includes("null") ? " | null" : "";
      if (isInlineObject(p)) {
        rows.push([code(field), code(`object${nullable}`), yes(required.has(name)), this.notes(p)]);
        rows.push(...this.fieldRows(p, `${field}.`));
      } else if (types(p).includes("array") && p.items && isInlineObject(p.items)) {
        rows.push([code(field), code(`object[]${nullable}`), yes(required.has(name)), this.notes(p)]);
        rows.push(...this.fieldRows(p.items, `${field}[].`));
      } else {
        rows.push([code(field), this.type(p), yes(required.has(name)), this.notes(p)]);
      }
    }
    return rows;
  }

  /**
   * A body or component schema as a block: a field table for objects (allOf parts merged, with
   * the schemas it extends named first), a line with its type otherwise.
   */
  schemaBlock(s: Schema): string[] {
    const parts = s.allOf ? s.allOf.filter((m) => !annotationOnly(m)) : [s];
    const bases = parts.filter((m) => m.$ref);
    const objects = parts.filter(isInlineObject);
    if (objects.length === 0 || bases.length + objects.length !== parts.length) {
      return [`Type: ${this.type(s)}`];
    }
    const out: string[] = [];
    if (bases.length > 0) {
      out.push(`All fields of ${bases.map((b) => this.ref(b.$ref as string)).join(" and ")}, and:`, "");
    }
    out.push(
      ...table(
        ["field", "type", "required", "description"],
        objects.flatMap((o) => this.fieldRows(o)),
      ),
    );
    if (objects.every((o) => o.additionalProperties === false)) out.push("", "No other fields.");
    return out;
  }

  parameter(p: Parameter): Parameter {
    if (!p.$ref) return p;
    const name = /^#\/components\/parameters\/(.+)$/.exec(p.$ref)?.[1];
    const resolved = name ? this.doc.components?.parameters?.[name] : undefined;
    if (!resolved) throw new Error(`unresolved parameter ${p.$ref}`);
    return resolved;
  }
}

export function yes(required: boolean): string {
  return required ? "yes" : "no";
}
