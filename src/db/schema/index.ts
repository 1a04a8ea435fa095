// The database schema, one module per part; this index is what the code imports
// (`../db/schema`) and what drizzle-kit reads (drizzle.config.ts).
export * from "./accounts";
export * from "./audit";
export * from "./compute";
export * from "./files";
export * from "./notifications";
export * from "./retries";
export * from "./runs";
export * from "./setup-images";
export * from "./vault";
export * from "./webhooks";
