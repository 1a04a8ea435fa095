import { MAX_AUDIT_BODY_BYTES, signAuditBatch } from "@benchwright/shared/contract/proxy-wire";
import { describe, expect, it } from "vitest";
import { expectProblem, newTenant } from "./harness";
import { auditBatch, auditRows, NO_AUDIT_ROWS, newRun, paths, postBatch, signed } from "./run-fixtures";

// POST /internal/runs/{runId}/audit, the signed batches of blocked hosts and egress routes a
// run's proxy (or local agent) reports: case D5 (a replayed batch is stored once, a batch for
// another run is refused), cases D1 and D2 for this channel's signatures, how batches add up,
// and the body limit.

describe("POST /internal/runs/{runId}/audit (D5)", { timeout: 60_000 }, () => {
  const at = (minute: number) => new Date(Date.UTC(2026, 0, 1, 12, minute)).toISOString();

  // case D5
  it("the same signed batch twice → stored once (204, then 409 already_stored)", async () => {
    const run = await newRun(await newTenant());
    const batch = auditBatch(run.id, {
      blockedHosts: [{ host: "evil.example", count: 3, firstSeen: at(0), lastSeen: at(1) }],
      egressRoutes: [{ host: "api.example", route: "direct", count: 5, firstSeen: at(0), lastSeen: at(2) }],
    });
    const { body, headers } = signed(run.auditKey, batch);
    const send = () =>
      run.proxy("POST", paths.audit(run), body, { ...headers, "content-type": "application/json" });
    const first = await send();
    expect(first.status, first.text).toBe(204);
    expect(first.text).toBe("");
    expectProblem(await send(), 409, "already_stored");
    // Re-signed later (a retry after a lost answer): still the same batch id, still once.
    expectProblem(await postBatch(run, batch), 409, "already_stored");
    const rows = await auditRows(run.id);
    expect(rows.blocked.map((r) => r.seenCount)).toEqual([3]);
    expect(rows.routes.map((r) => r.count)).toEqual([5]);
  });

  // case D5, and case D1 and case D2 for the audit channel
  it("a batch naming another run → 403 wrong_run; bad signature, another run's key, stale or future timestamp → 401 invalid_signature", async () => {
    const t = await newTenant();
    const a = await newRun(t);
    const b = await newRun(t);
    const rows = { blockedHosts: [{ host: "evil.example", count: 1, firstSeen: at(0), lastSeen: at(0) }] };
    // Signed with A's key, sent to A's path with A's token, but naming B.
    expectProblem(await postBatch(a, auditBatch(b.id, rows)), 403, "wrong_run");
    // Signed with B's key for A.
    expectProblem(await postBatch(a, auditBatch(a.id, rows), { key: b.auditKey }), 401, "invalid_signature");
    // Stale and future: outside the 5-minute window.
    const minutes = (n: number) => new Date(Date.now() + n * 60_000);
    expectProblem(await postBatch(a, auditBatch(a.id, rows), { at: minutes(-6) }), 401, "invalid_signature");
    expectProblem(await postBatch(a, auditBatch(a.id, rows), { at: minutes(6) }), 401, "invalid_signature");
    // Body changed after signing.
    const batch = auditBatch(a.id, rows);
    const { body, headers } = signed(a.auditKey, batch);
    const tampered = body.replace('"count":1', '"count":9');
    expect(tampered).not.toBe(body);
    expectProblem(await a.proxy("POST", paths.audit(a), tampered, headers), 401, "invalid_signature");
    // No signature at all.
    expectProblem(await a.proxy("POST", paths.audit(a), body), 401, "invalid_signature");
    // Signed, but not a batch: an extra field (a path has no place in an audit row).
    const withPath = JSON.stringify({ ...batch, path: "/secret" });
    const sig = signAuditBatch(a.auditKey, batch.batchId, new Date(), withPath);
    expectProblem(await a.proxy("POST", paths.audit(a), withPath, sig), 400, "invalid_request");
    // None of it was stored, not even the batch ids: the real batch is still accepted.
    expect(await auditRows(a.id)).toEqual(NO_AUDIT_ROWS);
    expect(await auditRows(b.id)).toEqual(NO_AUDIT_ROWS);
    expect((await postBatch(a, batch)).status).toBe(204);
  });

  it("counts add up across batches; first/last seen widen; a host both sources reported is 'both'", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const first = auditBatch(run.id, {
      blockedHosts: [
        { host: "evil.example", count: 3, firstSeen: at(10), lastSeen: at(12) },
        { host: "only-proxy.example", count: 1, firstSeen: at(10), lastSeen: at(10) },
      ],
      egressRoutes: [
        { host: "api.example", route: "tunnel", count: 4, firstSeen: at(10), lastSeen: at(11) },
        { host: "api.example", route: "refused", count: 1, firstSeen: at(10), lastSeen: at(10) },
      ],
    });
    const second = auditBatch(run.id, {
      source: "local_agent",
      blockedHosts: [
        { host: "evil.example", count: 2, firstSeen: at(5), lastSeen: at(11) },
        { host: "only-agent.example", count: 7, firstSeen: at(20), lastSeen: at(21) },
      ],
      egressRoutes: [{ host: "api.example", route: "tunnel", count: 6, firstSeen: at(11), lastSeen: at(30) }],
    });
    const third = auditBatch(run.id, {
      blockedHosts: [{ host: "only-agent.example", count: 1, firstSeen: at(22), lastSeen: at(22) }],
    });
    for (const batch of [first, second, third]) expect((await postBatch(run, batch)).status).toBe(204);
    const rows = await auditRows(run.id);
    expect(
      rows.blocked.map((r) => ({
        host: r.host,
        n: r.seenCount,
        first: r.firstSeen.toISOString(),
        last: r.lastSeen.toISOString(),
        source: r.source,
        userId: r.userId,
        environmentId: r.environmentId,
      })),
    ).toEqual([
      {
        host: "evil.example",
        n: 5,
        first: at(5),
        last: at(12),
        source: "both",
        userId: t.userId,
        environmentId: t.environmentId,
      },
      {
        host: "only-agent.example",
        n: 8,
        first: at(20),
        last: at(22),
        source: "both",
        userId: t.userId,
        environmentId: t.environmentId,
      },
      {
        host: "only-proxy.example",
        n: 1,
        first: at(10),
        last: at(10),
        source: "proxy",
        userId: t.userId,
        environmentId: t.environmentId,
      },
    ]);
    expect(
      rows.routes.map((r) => [r.host, r.route, r.count, r.firstSeen.toISOString(), r.lastSeen.toISOString()]),
    ).toEqual([
      ["api.example", "refused", 1, at(10), at(10)],
      ["api.example", "tunnel", 10, at(10), at(30)],
    ]);
    expect(rows.routes.every((r) => r.environmentId === t.environmentId)).toBe(true);
  });

  // case N3 and case N2: what the proxy recorded of limits and placeholders, stored per run
  it("limit refusals and stray placeholders: stored with the batch, once per batch id, counts added", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const first = auditBatch(run.id, {
      limitRefusals: [
        {
          host: "api.example",
          method: "DELETE",
          limit: "method",
          count: 2,
          firstSeen: at(10),
          lastSeen: at(12),
        },
        { host: "api.example", method: "GET", limit: "path", count: 1, firstSeen: at(10), lastSeen: at(10) },
        {
          host: "api.example",
          method: "GET",
          limit: "unnormalisable_path",
          count: 4,
          firstSeen: at(11),
          lastSeen: at(11),
        },
      ],
      strayPlaceholders: [
        { host: "evil.example", secret: "API_KEY", count: 3, firstSeen: at(10), lastSeen: at(13) },
        { host: "evil.example", secret: "OTHER_KEY", count: 1, firstSeen: at(10), lastSeen: at(10) },
      ],
    });
    expect((await postBatch(run, first)).status).toBe(204);
    // Re-sent (the proxy's retry after a lost answer): the same batch id, counted once (case D5).
    expectProblem(await postBatch(run, first), 409, "already_stored");
    const once = await auditRows(run.id);
    expect(once.limits.map((r) => [r.host, r.method, r.limit, r.count])).toEqual([
      ["api.example", "DELETE", "method", 2],
      ["api.example", "GET", "path", 1],
      ["api.example", "GET", "unnormalisable_path", 4],
    ]);
    expect(once.strays.map((r) => [r.host, r.secret, r.count])).toEqual([
      ["evil.example", "API_KEY", 3],
      ["evil.example", "OTHER_KEY", 1],
    ]);

    const second = auditBatch(run.id, {
      limitRefusals: [
        {
          host: "api.example",
          method: "DELETE",
          limit: "method",
          count: 5,
          firstSeen: at(5),
          lastSeen: at(11),
        },
        {
          host: "api.example",
          method: "DELETE",
          limit: "path",
          count: 1,
          firstSeen: at(20),
          lastSeen: at(20),
        },
      ],
      strayPlaceholders: [
        { host: "evil.example", secret: "API_KEY", count: 6, firstSeen: at(11), lastSeen: at(30) },
      ],
    });
    expect((await postBatch(run, second)).status).toBe(204);
    const rows = await auditRows(run.id);
    const shown = (r: { count: number; firstSeen: Date; lastSeen: Date; environmentId: string }) => [
      r.count,
      r.firstSeen.toISOString(),
      r.lastSeen.toISOString(),
      r.environmentId,
    ];
    expect(rows.limits.map((r) => [r.method, r.limit, ...shown(r)])).toEqual([
      ["DELETE", "method", 7, at(5), at(12), t.environmentId],
      ["DELETE", "path", 1, at(20), at(20), t.environmentId],
      ["GET", "path", 1, at(10), at(10), t.environmentId],
      ["GET", "unnormalisable_path", 4, at(11), at(11), t.environmentId],
    ]);
    expect(rows.strays.map((r) => [r.secret, ...shown(r)])).toEqual([
      ["API_KEY", 9, at(10), at(30), t.environmentId],
      ["OTHER_KEY", 1, at(10), at(10), t.environmentId],
    ]);
  });

  it("a limit refusal with a bad method or a repeated key, a repeated stray → 400, nothing stored", async () => {
    const run = await newRun(await newTenant());
    const refusal = {
      host: "api.example",
      method: "DELETE",
      limit: "method" as const,
      count: 1,
      firstSeen: at(0),
      lastSeen: at(0),
    };
    const stray = { host: "evil.example", secret: "API_KEY", count: 1, firstSeen: at(0), lastSeen: at(0) };
    const refused = [
      // Methods are uppercase tokens: a lowercase one, a space, a path in the method.
      { limitRefusals: [{ ...refusal, method: "delete" }] },
      { limitRefusals: [{ ...refusal, method: "GET /admin" }] },
      { limitRefusals: [{ ...refusal, limit: "header" as "method" }] },
      // A row carries no path (strict rows) and no placeholder value.
      { limitRefusals: [{ ...refusal, path: "/admin" }] },
      { strayPlaceholders: [{ ...stray, value: "bw-placeholder-API_KEY-x" }] },
      // One row per key: the proxy aggregates, so a repeat is a broken batch.
      { limitRefusals: [refusal, { ...refusal, count: 2 }] },
      { strayPlaceholders: [stray, { ...stray, count: 2 }] },
      // A stray's secret is a secret name.
      { strayPlaceholders: [{ ...stray, secret: "not a name" }] },
    ];
    let batchId = "";
    for (const fields of refused) {
      const batch = { ...auditBatch(run.id), ...fields } as ReturnType<typeof auditBatch>;
      expectProblem(await postBatch(run, batch), 400, "invalid_request");
      batchId = batch.batchId;
    }
    expect(await auditRows(run.id)).toEqual(NO_AUDIT_ROWS);
    // A refused batch's id was not taken: the good batch under that id is stored.
    const valid = auditBatch(run.id, { batchId, limitRefusals: [refusal], strayPlaceholders: [stray] });
    expect((await postBatch(run, valid)).status).toBe(204);
    expect((await auditRows(run.id)).limits).toHaveLength(1);
  });

  it("a body over MAX_AUDIT_BODY_BYTES → 413 payload_too_large, before it is read", async () => {
    const run = await newRun(await newTenant());
    const big = "x".repeat(MAX_AUDIT_BODY_BYTES + 1);
    const { headers } = signed(run.auditKey, auditBatch(run.id));
    expectProblem(await run.proxy("POST", paths.audit(run), big, headers), 413, "payload_too_large");
  });
});
