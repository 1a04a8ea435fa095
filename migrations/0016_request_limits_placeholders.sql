CREATE TABLE "limit_refusal_log" (
	"environment_id" text NOT NULL,
	"run_id" text NOT NULL,
	"host" text NOT NULL,
	"method" text NOT NULL,
	"limit" text NOT NULL,
	"count" bigint NOT NULL,
	"first_seen" timestamp with time zone NOT NULL,
	"last_seen" timestamp with time zone NOT NULL,
	CONSTRAINT "limit_refusal_log_run_id_host_method_limit_pk" PRIMARY KEY("run_id","host","method","limit")
);
--> statement-breakpoint
CREATE TABLE "stray_placeholder_log" (
	"environment_id" text NOT NULL,
	"run_id" text NOT NULL,
	"host" text NOT NULL,
	"secret" text NOT NULL,
	"count" bigint NOT NULL,
	"first_seen" timestamp with time zone NOT NULL,
	"last_seen" timestamp with time zone NOT NULL,
	CONSTRAINT "stray_placeholder_log_run_id_host_secret_pk" PRIMARY KEY("run_id","host","secret")
);
--> statement-breakpoint
ALTER TABLE "vault_hosts" ADD COLUMN "methods" text[];--> statement-breakpoint
ALTER TABLE "vault_hosts" ADD COLUMN "paths" text[];--> statement-breakpoint
ALTER TABLE "vault_rules" ADD COLUMN "placeholder_env" text;--> statement-breakpoint
ALTER TABLE "vault_rules" ADD COLUMN "placeholder" boolean DEFAULT true NOT NULL;--> statement-breakpoint
ALTER TABLE "vault_rules" ADD COLUMN "placeholder_in" text[] DEFAULT '{}'::text[] NOT NULL;--> statement-breakpoint
ALTER TABLE "vault_rules" ADD COLUMN "methods" text[];--> statement-breakpoint
ALTER TABLE "vault_rules" ADD COLUMN "paths" text[];--> statement-breakpoint
ALTER TABLE "limit_refusal_log" ADD CONSTRAINT "limit_refusal_log_environment_id_environments_id_fk" FOREIGN KEY ("environment_id") REFERENCES "public"."environments"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "limit_refusal_log" ADD CONSTRAINT "limit_refusal_log_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "public"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "stray_placeholder_log" ADD CONSTRAINT "stray_placeholder_log_environment_id_environments_id_fk" FOREIGN KEY ("environment_id") REFERENCES "public"."environments"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "stray_placeholder_log" ADD CONSTRAINT "stray_placeholder_log_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "public"."runs"("id") ON DELETE cascade ON UPDATE no action;