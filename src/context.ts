import type { ApiKeyScope } from "@benchwright/shared/contract/api-key-scope";
import type { Owner } from "./auth/owner";
import type { Config } from "./config";
import type { Db } from "./db/types";

/** Who the request's API key speaks for: its owner, which scopes every query, and the key. */
export interface Principal extends Owner {
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
