import type { InjectSpec } from "@benchwright/shared/contract/policy";

// Credential injection for one request: the header value or query parameter a rule asks for.
// Returns the exact injected text too, so the response can be scrubbed of it (case B7).

export interface Injection {
  /** Path (with query) to send upstream. */
  path: string;
  /** Header to set (lowercase name), if the scheme is a header scheme. */
  header: [string, string] | null;
  /** The exact bytes placed on the wire. */
  injected: string;
}

export function inject(spec: InjectSpec, secret: string, path: string): Injection {
  switch (spec.scheme) {
    case "bearer":
      return { path, header: [spec.name, `Bearer ${secret}`], injected: `Bearer ${secret}` };
    case "basic": {
      const encoded = Buffer.from(secret, "latin1").toString("base64");
      return { path, header: [spec.name, `Basic ${encoded}`], injected: encoded };
    }
    case "raw":
      return { path, header: [spec.name, secret], injected: secret };
    case "query": {
      // Replace any value the sandbox sent for the parameter: the vault's credential wins.
      const url = new URL(path, "http://placeholder.invalid");
      url.searchParams.set(spec.name, secret);
      const encoded = new URLSearchParams([["x", secret]]).toString().slice(2);
      return { path: `${url.pathname}${url.search}`, header: null, injected: encoded };
    }
  }
}
