import type { ApiKeyScope } from "@benchwright/shared/contract/api-key-scope";
import type { Config } from "./config";
import type { Db } from "./db/types";

/** Who the request's API key speaks for. Every query a route makes is scoped by this. */
export interface Principal {
  readonly userId: string;
  readonly environmentId: string;
  readonly keyId: string;
}

export interface AppEnv {
  Bindings: Env;
  Variables: {
    requestId: string;
    config: Config;
    db: Db;
    principal: Principal;
    /** What the request's API key may do (src/auth/scope.ts). */
    keyScope: ApiKeyScope;
  };
}
