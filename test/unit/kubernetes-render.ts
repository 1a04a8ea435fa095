import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";

// Renders deploy/kubernetes/ with kubectl's built-in kustomize, as an operator's
// `kubectl apply -k` would. kubectl 1.27 or later carries kustomize 5 (CI machines ship 1.32 with
// 5.5); Debian's kubernetes-client package is 1.20 with kustomize 2, which knows neither the
// base's `labels` field nor `images[].digest` as written, so it is refused here by name.

export const BASE_DIR = fileURLToPath(new URL("../../deploy/kubernetes", import.meta.url));

/** A rendered object, as far as the tests read it. */
export interface RenderedObject {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string> };
  [field: string]: unknown;
}

const MIN_KUSTOMIZE_MAJOR = 5;

function kubectl(args: string[]): string {
  const run = spawnSync("kubectl", args, { encoding: "utf8" });
  if (run.error) {
    throw new Error(
      `kubectl is needed to render deploy/kubernetes (kubectl ≥ 1.27, kustomize ${MIN_KUSTOMIZE_MAJOR}): ${run.error.message}`,
    );
  }
  if (run.status !== 0) throw new Error(`kubectl ${args.join(" ")} failed: ${run.stderr}`);
  return run.stdout;
}

/** kubectl's kustomize version, refused when older than kustomize 5. */
export function kustomizeVersion(): string {
  const info = JSON.parse(kubectl(["version", "--client", "--output=json"])) as { kustomizeVersion?: string };
  const version = info.kustomizeVersion ?? "";
  const major = Number(/^v?(\d+)\./.exec(version)?.[1] ?? 0);
  if (major < MIN_KUSTOMIZE_MAJOR) {
    throw new Error(
      `kubectl's kustomize is ${version || "unknown"}; deploy/kubernetes needs kustomize ${MIN_KUSTOMIZE_MAJOR} (kubectl ≥ 1.27, not Debian's kubernetes-client 1.20)`,
    );
  }
  return version;
}

/** Every object of the rendered base, in kustomize's order. */
export function renderBase(dir = BASE_DIR): RenderedObject[] {
  kustomizeVersion();
  return parseAllDocuments(kubectl(["kustomize", dir]))
    .map((doc) => {
      if (doc.errors.length > 0) throw new Error(`kustomize wrote invalid YAML: ${doc.errors[0]?.message}`);
      return doc.toJS() as RenderedObject | null;
    })
    .filter((o): o is RenderedObject => o !== null);
}
