import type { ServerResponse } from "node:http";
import { Writable } from "node:stream";

// The model lane's answer on its way to the sandbox, which may hang up before it ends. A call
// that reached the provider is read to its end whatever the sandbox does (case L3): its usage
// (the budget's count, the run's record) comes last, and the provider bills the call anyway. So
// this sink passes bytes to the response while the sandbox is there, with its backpressure, and
// drops them once it is gone, instead of failing and cutting the upstream read short.

export class ToClient extends Writable {
  private gone = false;
  private cut = false;
  private waiting: (() => void) | null = null;

  constructor(private readonly res: ServerResponse) {
    super();
    // Gone already (while the provider was being asked): its close came before this sink.
    this.gone = res.destroyed;
    res.once("close", () => {
      if (!res.writableFinished && !this.cut) this.gone = true;
      this.resume();
    });
  }

  /** Whether the sandbox went away before the whole answer was handed to it. */
  get clientGone(): boolean {
    return this.gone;
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, done: (error?: Error | null) => void): void {
    if (this.gone || this.res.destroyed || this.res.write(chunk)) {
      done();
      return;
    }
    this.waiting = done;
    this.res.once("drain", () => this.resume());
  }

  override _final(done: (error?: Error | null) => void): void {
    if (this.gone || this.res.destroyed) {
      done();
      return;
    }
    // Finished once the response is (or the sandbox went away meanwhile).
    const end = () => {
      this.res.off("finish", end);
      this.res.off("close", end);
      done();
    };
    this.res.once("finish", end);
    this.res.once("close", end);
    this.res.end();
  }

  override _destroy(error: Error | null, done: (error?: Error | null) => void): void {
    // The answer failed on the way (upstream, decoding, a bound): the sandbox sees it cut. The
    // error is the relay's to report (it rejects), not an event of this sink's.
    if (error !== null) {
      this.cut = true;
      this.res.destroy();
    }
    this.waiting = null;
    done(null);
  }

  private resume(): void {
    const go = this.waiting;
    this.waiting = null;
    go?.();
  }
}
