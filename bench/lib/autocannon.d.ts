// The slice of autocannon 9's programmatic API the bench uses (the package ships no types, and
// @types/autocannon describes an older major).
declare module "autocannon" {
  import type { EventEmitter } from "node:events";
  import type { ConnectionOptions } from "node:tls";

  interface Options {
    url: string;
    connections?: number;
    pipelining?: number;
    /** Seconds. */
    duration?: number;
    /** Seconds before a request counts as timed out. */
    timeout?: number;
    method?: string;
    headers?: Record<string, string>;
    servername?: string;
    tlsOptions?: ConnectionOptions;
  }

  interface Result {
    /** Seconds the run lasted. */
    duration: number;
    errors: number;
    timeouts: number;
    non2xx: number;
    "2xx": number;
  }

  interface Instance extends EventEmitter {
    stop(): void;
    on(
      event: "response",
      listener: (client: unknown, statusCode: number, resBytes: number, responseTimeMs: number) => void,
    ): this;
    on(event: string, listener: (...args: unknown[]) => void): this;
  }

  function autocannon(options: Options, done: (err: Error | null, result: Result) => void): Instance;
  export default autocannon;
}
