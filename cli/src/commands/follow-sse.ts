// Server-Sent Events as the API sends them (GET /v1/runs/{id}/events with Accept:
// text/event-stream): frames of `field: value` lines ended by a blank line (\n, or \r\n).
// Comment lines (`:`) and `retry:` carry nothing to read; several `data:` lines are one value
// joined by newlines.

export interface SseFrame {
  id: string | null;
  event: string;
  data: string;
}

/** The frames of a body, as they arrive; ends when the body ends (a cut frame is dropped). */
export async function* sseFrames(body: ReadableStream<Uint8Array>): AsyncGenerator<SseFrame> {
  let buffer = "";
  let frame: { id: string | null; event: string; data: string[] } = { id: null, event: "message", data: [] };
  const decoder = new TextDecoder();
  for await (const chunk of body) {
    buffer += decoder.decode(chunk, { stream: true });
    for (;;) {
      const end = buffer.indexOf("\n");
      if (end < 0) break;
      const line = buffer.slice(0, end).replace(/\r$/, "");
      buffer = buffer.slice(end + 1);
      if (line === "") {
        if (frame.data.length > 0) yield { id: frame.id, event: frame.event, data: frame.data.join("\n") };
        frame = { id: null, event: "message", data: [] };
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const name = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (name === "id") frame.id = value;
      else if (name === "event") frame.event = value;
      else if (name === "data") frame.data.push(value);
    }
  }
}
