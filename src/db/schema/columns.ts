import { timestamp } from "drizzle-orm/pg-core";

// Column helpers every table module uses. Ids are opaque prefixed strings (usr_..., env_...,
// sec_...) made by randomId().
export const createdAt = () => timestamp("created_at", { withTimezone: true }).notNull().defaultNow();
export const updatedAt = () => timestamp("updated_at", { withTimezone: true }).notNull().defaultNow();
