// proxy-image/src/model/translate.ts — pure: no Node I/O, no network.
import type { Refusal, Translation, Usage, WireFormat } from "./translate-types";

export type {
  Refusal,
  RequestOptions,
  RequestResult,
  SseEvent,
  StreamTranslator,
  Translation,
  Usage,
  WireFormat,
} from "./translate-types";

/** null when from === to's native pair needs no translation (passthrough). */
export function translation(from: WireFormat, to: WireFormat): Translation | null {
  if (from === to) return null;
  throw new Error(`translation ${from} → ${to}: not built yet`);
}

/** An error the lane itself raises (model_not_declared, over_budget...), in the caller's format. */
export function errorBody(format: WireFormat, r: Refusal): Record<string, unknown> {
  if (format === "anthropic-messages") return { type: "error", error: { type: r.type, message: r.message } };
  return { error: { message: r.message, type: r.type, param: r.param ?? null, code: r.type } };
}

/** Usage from a provider answer in its own format (whole body or one stream event). */
export function readUsage(_format: WireFormat, _body: unknown): Usage {
  return { input: 0, output: 0, cached: 0 };
}
