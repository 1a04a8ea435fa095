ALTER TABLE "model_call_log" ADD COLUMN "cached_input_tokens" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "model_call_log" ADD COLUMN "refused" text;--> statement-breakpoint
-- The provider was a free-text label; every model before this spoke OpenAI's format with a Bearer
-- key, so a label other than openai becomes openai-compatible (the same calls as before).
UPDATE "vault_models" SET "provider" = 'openai-compatible' WHERE "provider" NOT IN ('openai', 'openai-compatible', 'anthropic');--> statement-breakpoint
ALTER TABLE "vault_models" ADD CONSTRAINT "vault_models_provider" CHECK ("vault_models"."provider" in ('openai', 'openai-compatible', 'anthropic'));