import { Hono } from "hono";
import { ErrorCode, problemInfo } from "../errors";
import type { PageEnv } from "./context";
import { Layout } from "./layout";

// The pages a problem's `type` names (RFC 9457: a URI that, dereferenced, documents the problem
// type): /problems lists every code of the API, /problems/<code> says what one means. Public
// and static: no session, no database; an unknown code is a 404 page.

function ProblemPage(props: { code: ErrorCode }) {
  const { status, title } = problemInfo(props.code);
  return (
    <Layout title={props.code}>
      <h1>
        <code>{props.code}</code>
      </h1>
      <p>{title}.</p>
      <p class="muted">
        HTTP status {status}. An answer with this problem has <code>"code": "{props.code}"</code> and a{" "}
        <code>detail</code> saying what was wrong with that request; quote its <code>requestId</code> when
        reporting it.
      </p>
      <p>
        <a href="/problems">All problem codes</a>
      </p>
    </Layout>
  );
}

function ProblemIndex() {
  return (
    <Layout title="Problem codes">
      <h1>Problem codes</h1>
      <p class="muted">Every refusal of the API is application/problem+json with one of these codes.</p>
      <table>
        <thead>
          <tr>
            <th>Code</th>
            <th style="width:5rem">Status</th>
            <th>Meaning</th>
          </tr>
        </thead>
        <tbody>
          {ErrorCode.options.map((code) => (
            <tr>
              <td>
                <a href={`/problems/${code}`}>
                  <code>{code}</code>
                </a>
              </td>
              <td>{problemInfo(code).status}</td>
              <td>{problemInfo(code).title}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </Layout>
  );
}

export const problemPageRoutes = new Hono<PageEnv>()
  .get("/problems", (c) => c.html(<ProblemIndex />))
  .get("/problems/:code", (c) => {
    const code = ErrorCode.safeParse(c.req.param("code"));
    if (!code.success) {
      return c.html(
        <Layout title="No such problem">
          <h1>No such problem code</h1>
          <p>
            <a href="/problems">All problem codes</a>
          </p>
        </Layout>,
        404,
      );
    }
    return c.html(<ProblemPage code={code.data} />);
  });
