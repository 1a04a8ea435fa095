import { ModelProvider } from "@benchwright/shared/contract/policy";
import { Hono } from "hono";
import { ModelName } from "../../routes/vault-models";
import * as models from "../../vault/models";
import { PROVIDERS } from "../../vault/models";
import type { PageEnv } from "../context";
import { PostForm } from "../layout";
import { act, answer, back, type Ctx, form, PAGE, text, who } from "./forms";
import { CodeCell, DeleteCell, Section, Table } from "./section";

// The vault page's models section: the models a run may declare, added and deleted with the same
// service calls as POST/DELETE /v1/vault/models. A model names its secret; the secret's value is
// never on this page (only the name is ever read back from the vault).

const PROVIDER_HINT: Readonly<Record<ModelProvider, string>> = {
  openai: "OpenAI",
  "openai-compatible": "OpenAI's format elsewhere (OpenRouter, vLLM...): give its base URL",
  anthropic: "Anthropic's Messages API",
};

export function ModelsSection(props: {
  c: Ctx;
  csrf: string;
  models: models.ModelInfo[];
  secrets: string[];
}) {
  const { c, csrf, models } = props;
  const kept = (k: string) => c.req.query(k) ?? "";
  return (
    <Section id="models" title="Models">
      <p class="muted">
        A model a run may declare (<code>model</code> in the run spec). The run's proxy serves it to the run's
        commands in OpenAI's and Anthropic's formats and calls the provider with the secret's value; the
        commands get placeholders only. The declared model stays outside host policy by design: it is what the
        run evaluates.
      </p>
      <Table
        rows={models}
        empty="No models yet."
        head={["Name", "Provider", "Base URL", "Upstream model", "Secret", "Delete"]}
        widths={["c-name", "c-name", "", "c-name", "c-name", "c-btn"]}
        row={(m) => (
          <tr>
            <CodeCell text={m.name} />
            <td>
              {m.provider}
              <div class="muted">{`key as ${PROVIDERS[m.provider].auth}`}</div>
            </td>
            <td class="mono">{m.baseUrl}</td>
            <td class="mono">{m.upstreamModel}</td>
            <CodeCell text={m.secret} />
            <DeleteCell action={`${PAGE}/models/${m.id}/delete`} csrf={csrf} />
          </tr>
        )}
      />
      <h3>Add a model</h3>
      {props.secrets.length === 0 ? (
        <p class="empty">Add the provider's key as a secret first.</p>
      ) : (
        <PostForm action={`${PAGE}/models`} csrf={csrf} class="fields">
          <label>
            Name{" "}
            <input name="name" required maxlength={128} placeholder="eval-model" value={kept("modelName")} />
          </label>{" "}
          <label>
            Provider{" "}
            <select name="provider">
              {ModelProvider.options.map((p) => (
                <option value={p} selected={kept("modelProvider") === p}>
                  {`${p}: ${PROVIDER_HINT[p]}`}
                </option>
              ))}
            </select>
          </label>{" "}
          <label>
            Base URL{" "}
            <input
              name="baseUrl"
              maxlength={2048}
              size={34}
              placeholder="default for openai and anthropic"
              value={kept("modelBaseUrl")}
            />
          </label>{" "}
          <label>
            Upstream model{" "}
            <input
              name="upstreamModel"
              maxlength={128}
              placeholder="default: the name"
              value={kept("modelUpstream")}
            />
          </label>{" "}
          <label>
            Secret{" "}
            <select name="secret">
              {props.secrets.map((s) => (
                <option value={s} selected={kept("modelSecret") === s}>
                  {s}
                </option>
              ))}
            </select>
          </label>{" "}
          <button type="submit">Add model</button>
        </PostForm>
      )}
    </Section>
  );
}

export const modelsRoutes = new Hono<PageEnv>()
  .post(`${PAGE}/models`, (c) =>
    act(c, "models", async () => {
      const f = await form(c);
      const name = text(f, "name");
      const baseUrl = text(f, "baseUrl");
      const upstreamModel = text(f, "upstreamModel");
      const secret = text(f, "secret");
      const provider = ModelProvider.safeParse(text(f, "provider"));
      // A base URL may carry user info (a credential): it is never kept across the redirect.
      const keep = {
        modelName: name,
        modelProvider: provider.data,
        modelUpstream: upstreamModel,
        modelSecret: secret,
      };
      if (!name || !ModelName.safeParse(name).success) {
        return back(
          c,
          { error: "Give the model a name: 1-128 printable characters, no spaces." },
          "models",
          keep,
        );
      }
      if (upstreamModel !== undefined && !ModelName.safeParse(upstreamModel).success) {
        return back(
          c,
          { error: "The upstream model: 1-128 printable characters, no spaces." },
          "models",
          keep,
        );
      }
      if (!provider.success) {
        return back(c, { error: `Pick a provider: ${ModelProvider.options.join(", ")}.` }, "models", keep);
      }
      if (!secret)
        return back(c, { error: "Pick the secret that holds the provider's key." }, "models", keep);
      const made = await models.createModel(c.var.db, who(c), {
        name,
        provider: provider.data,
        baseUrl,
        upstreamModel,
        secret,
      });
      return answer(
        c,
        made,
        (m) => `Added the model ${m.name} (${m.provider}, ${m.baseUrl}).`,
        "models",
        keep,
      );
    }),
  )
  .post(`${PAGE}/models/:id/delete`, (c) =>
    act(c, "models", async () => {
      const id = c.req.param("id");
      const model = await models.getModel(c.var.db, who(c), id);
      if (!model.ok) return answer(c, model, () => "", "models");
      const done = await models.deleteModel(c.var.db, who(c), id);
      return answer(c, done, () => `Deleted the model ${model.value.name}.`, "models");
    }),
  );
