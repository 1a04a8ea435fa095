import { createRequire } from "node:module";

// `ws` loaded by Node's own resolver. The worker test project's global setup (which starts the
// database bridge and the contract servers in Node) is loaded by vite under the Cloudflare
// plugin's resolve conditions (`workerd`, `worker`, `browser`), which pick ws's browser stub:
// it has no server and throws on use. `require` resolves with Node's conditions wherever it runs.
const ws = createRequire(import.meta.url)("ws") as typeof import("ws");

export const { WebSocket, WebSocketServer, createWebSocketStream } = ws;
export type WebSocket = import("ws").WebSocket;
export type WebSocketServer = import("ws").WebSocketServer;
