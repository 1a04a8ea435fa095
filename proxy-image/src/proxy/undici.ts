/// <reference path="./undici-lib.d.ts" />
// undici's Pool and connector, from its lib files rather than its index: the index also loads
// fetch, WebSocket, EventSource, the caches and the mocks, ~16 MiB of a proxy's RSS it never uses
// (bench/results: the memory bench). The one thing the index does that a Pool needs is to put the
// request API (request, stream, pipeline, upgrade, connect) on Dispatcher.prototype; done here the
// same way. These paths are undici's internals: undici is pinned exactly (proxy-image/package.json),
// and an upgrade must recheck them (the proxy tests fail at once if `pool.request` is missing).
import api from "undici/lib/api/index.js";
import buildConnector from "undici/lib/core/connect.js";
import Dispatcher from "undici/lib/dispatcher/dispatcher.js";
import Pool from "undici/lib/dispatcher/pool.js";

Object.assign(Dispatcher.prototype, api);

export { buildConnector, Pool };
