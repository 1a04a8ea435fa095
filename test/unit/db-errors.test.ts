import { describe, expect, it } from "vitest";
import { isDatabaseUnavailable, sqlState } from "../../src/db/errors";

// What the API answers 503 database_unavailable (retry later) rather than 500 (a bug), from the
// errors the Neon driver and drizzle actually throw (messages copied from failures seen in tests).

/** drizzle's wrapper around a driver error: the query in the message, the driver's on the cause. */
function drizzleWrapped(cause: unknown): Error {
  return Object.assign(new Error("Failed query: rollback\nparams: "), { cause });
}

describe("isDatabaseUnavailable (case E7)", () => {
  it.each([
    [
      "a connection cut mid-transaction",
      new Error("Client has encountered a connection error and is not queryable"),
    ],
    ["a connection terminated", new Error("Connection terminated unexpectedly")],
    ["a connect timeout", new Error("timeout exceeded when trying to connect")],
    ["a refused connection", new Error("connect ECONNREFUSED 127.0.0.1:1")],
    ["a SQLSTATE of the connection class", Object.assign(new Error("x"), { code: "08006" })],
    ["a server shutting down", Object.assign(new Error("x"), { code: "57P01" })],
  ])("%s, wrapped by drizzle → unavailable", (_label, cause) => {
    expect(isDatabaseUnavailable(drizzleWrapped(cause))).toBe(true);
    expect(isDatabaseUnavailable(cause)).toBe(true);
  });

  it.each([
    ["a unique violation", Object.assign(new Error("duplicate key"), { code: "23505" })],
    [
      "a statement timeout (a query problem, answered as such)",
      Object.assign(new Error("canceling statement due to statement timeout"), { code: "57014" }),
    ],
    ["a bug", new TypeError("cannot read properties of undefined")],
  ])("%s → not unavailable", (_label, cause) => {
    expect(isDatabaseUnavailable(drizzleWrapped(cause))).toBe(false);
  });
});

describe("sqlState", () => {
  it("finds Postgres's code under drizzle's wrapper, and nothing where there is none", () => {
    const timeout = Object.assign(new Error("canceling statement due to statement timeout"), {
      code: "57014",
    });
    expect(sqlState(drizzleWrapped(timeout))).toBe("57014");
    expect(sqlState(drizzleWrapped(new Error("connect ECONNREFUSED 127.0.0.1:1")))).toBeNull();
    expect(sqlState(Object.assign(new Error("x"), { code: "ECONNRESET" }))).toBeNull();
  });
});
