CREATE TABLE "model_call_log" (
	"environment_id" text NOT NULL,
	"run_id" text NOT NULL,
	"call_id" text NOT NULL,
	"at" timestamp with time zone NOT NULL,
	"model" text NOT NULL,
	"provider" text NOT NULL,
	"endpoint" text NOT NULL,
	"stream" boolean NOT NULL,
	"status" integer NOT NULL,
	"input_tokens" bigint NOT NULL,
	"output_tokens" bigint NOT NULL,
	"ms" integer NOT NULL,
	CONSTRAINT "model_call_log_run_id_call_id_pk" PRIMARY KEY("run_id","call_id")
);
--> statement-breakpoint
CREATE TABLE "vault_models" (
	"id" text PRIMARY KEY NOT NULL,
	"environment_id" text NOT NULL,
	"name" text NOT NULL,
	"provider" text NOT NULL,
	"base_url" text NOT NULL,
	"upstream_model" text NOT NULL,
	"secret_id" text NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "egress_token_hash" text;--> statement-breakpoint
ALTER TABLE "vault_hosts" ADD COLUMN "via" text;--> statement-breakpoint
ALTER TABLE "model_call_log" ADD CONSTRAINT "model_call_log_environment_id_environments_id_fk" FOREIGN KEY ("environment_id") REFERENCES "public"."environments"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "model_call_log" ADD CONSTRAINT "model_call_log_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "public"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "vault_models" ADD CONSTRAINT "vault_models_environment_id_environments_id_fk" FOREIGN KEY ("environment_id") REFERENCES "public"."environments"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "vault_models" ADD CONSTRAINT "vault_models_secret_id_vault_secrets_id_fk" FOREIGN KEY ("secret_id") REFERENCES "public"."vault_secrets"("id") ON DELETE restrict ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "model_call_log_run_at" ON "model_call_log" USING btree ("run_id","at");--> statement-breakpoint
CREATE UNIQUE INDEX "vault_models_environment_name" ON "vault_models" USING btree ("environment_id","name");--> statement-breakpoint
ALTER TABLE "runs" ADD CONSTRAINT "runs_egress_token_hash_unique" UNIQUE("egress_token_hash");--> statement-breakpoint
ALTER TABLE "vault_hosts" ADD CONSTRAINT "vault_hosts_via" CHECK ("vault_hosts"."via" is null or ("vault_hosts"."via" in ('direct', 'tunnel') and "vault_hosts"."action" = 'allow'));