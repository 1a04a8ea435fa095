// Types for the undici lib files proxy-image/src/proxy/undici.ts imports (undici types its index only).
declare module "undici/lib/api/index.js" {
  const api: Record<string, unknown>;
  export default api;
}
declare module "undici/lib/core/connect.js" {
  import { buildConnector } from "undici";
  export default buildConnector;
}
declare module "undici/lib/dispatcher/dispatcher.js" {
  import { Dispatcher } from "undici";
  export default Dispatcher;
}
declare module "undici/lib/dispatcher/pool.js" {
  import { Pool } from "undici";
  export default Pool;
}
