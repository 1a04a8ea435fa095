import type { BundleCode } from "../contract/bundle";

// The tree a bundle makes, kept while its entries are checked, so each entry is judged against
// the ones before it the way the extractor will meet them: no entry below a symlink (writing
// through one is how an archive reaches out of its tree, whatever the symlink's target), none
// below a file, no path made twice (bw-unpack creates with O_EXCL and would fail on it; the
// Worker refuses it at upload instead), and a hardlink only to a regular file made before it.
// Every node is a filesystem object the extractor creates, directories implied by a path
// included, so the count bound holds for what is made, not just for what is listed.

export type NodeKind = "dir" | "file" | "symlink" | "hardlink";

interface Node {
  kind: NodeKind;
  children: Map<string, Node> | null;
}

export type Placement = { ok: true; created: number } | { ok: false; code: BundleCode; why: string };

export class BundleTree {
  private readonly root: Node = { kind: "dir", children: new Map() };

  /** The kind of what `segments` names, or null when nothing of the tree is there yet. */
  kindAt(segments: readonly string[]): NodeKind | null {
    let node: Node | undefined = this.root;
    for (const segment of segments) {
      node = node.children?.get(segment);
      if (!node) return null;
    }
    return node.kind;
  }

  /**
   * Puts `kind` at `segments` (not the root), making the directories above it. Returns how many
   * nodes that made, or why it may not be there. On refusal the tree may hold some of the
   * directories; a refused bundle is not read further, so that does not matter.
   */
  place(segments: readonly string[], kind: NodeKind): Placement {
    let node = this.root;
    let created = 0;
    for (let i = 0; i < segments.length; i++) {
      const segment = segments[i] as string;
      const last = i === segments.length - 1;
      const children = node.children as Map<string, Node>;
      const existing = children.get(segment);
      if (existing === undefined) {
        const made: Node = { kind: last ? kind : "dir", children: last && kind !== "dir" ? null : new Map() };
        children.set(segment, made);
        created++;
        node = made;
        continue;
      }
      if (last) {
        // A directory listed twice (or listed after a path implied it) is harmless: mkdir finds it.
        if (existing.kind === "dir" && kind === "dir") return { ok: true, created };
        return { ok: false, code: "bundle_invalid", why: "a path the bundle makes twice" };
      }
      if (existing.kind === "symlink") {
        return { ok: false, code: "bundle_link_escape", why: "a path below a symlink of the bundle" };
      }
      if (existing.kind !== "dir") return { ok: false, code: "bundle_invalid", why: "a path below a file" };
      node = existing;
    }
    return { ok: true, created };
  }
}
