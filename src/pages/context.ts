import type { Session } from "../auth/session";
import type { AppEnv } from "../context";

/** The pages' request context: the API's, plus the browser session. */
export interface PageEnv {
  Bindings: AppEnv["Bindings"];
  Variables: AppEnv["Variables"] & { session: Session };
}
