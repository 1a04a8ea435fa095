CREATE TABLE "audit_batches" (
	"run_id" text NOT NULL,
	"batch_id" text NOT NULL,
	"received_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "audit_batches_run_id_batch_id_pk" PRIMARY KEY("run_id","batch_id")
);
--> statement-breakpoint
CREATE TABLE "blocked_host_log" (
	"user_id" text NOT NULL,
	"environment_id" text NOT NULL,
	"run_id" text NOT NULL,
	"host" text NOT NULL,
	"seen_count" bigint NOT NULL,
	"first_seen" timestamp with time zone NOT NULL,
	"last_seen" timestamp with time zone NOT NULL,
	"source" text NOT NULL,
	CONSTRAINT "blocked_host_log_run_id_host_pk" PRIMARY KEY("run_id","host")
);
--> statement-breakpoint
CREATE TABLE "egress_route_log" (
	"environment_id" text NOT NULL,
	"run_id" text NOT NULL,
	"host" text NOT NULL,
	"route" text NOT NULL,
	"count" bigint NOT NULL,
	"first_seen" timestamp with time zone NOT NULL,
	"last_seen" timestamp with time zone NOT NULL,
	CONSTRAINT "egress_route_log_run_id_host_route_pk" PRIMARY KEY("run_id","host","route")
);
--> statement-breakpoint
CREATE TABLE "run_events" (
	"id" bigserial PRIMARY KEY NOT NULL,
	"run_id" text NOT NULL,
	"key" text NOT NULL,
	"kind" text NOT NULL,
	"state" text,
	"reason" text,
	"detail" jsonb,
	"at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
CREATE TABLE "runs" (
	"id" text PRIMARY KEY NOT NULL,
	"user_id" text NOT NULL,
	"environment_id" text NOT NULL,
	"status" text DEFAULT 'queued' NOT NULL,
	"reason" text,
	"reason_detail" text,
	"spec" jsonb NOT NULL,
	"backend" text NOT NULL,
	"routing" text,
	"policy_version" bigint,
	"notes" jsonb DEFAULT '[]'::jsonb NOT NULL,
	"proof" jsonb,
	"proxy_token_hash" text,
	"audit_key_ciphertext" text,
	"ca_cert_pem" text,
	"ca_fingerprint" text,
	"proxy_ready_at" timestamp with time zone,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"updated_at" timestamp with time zone DEFAULT now() NOT NULL,
	"started_at" timestamp with time zone,
	"ended_at" timestamp with time zone,
	CONSTRAINT "runs_proxy_token_hash_unique" UNIQUE("proxy_token_hash"),
	CONSTRAINT "runs_status" CHECK ("runs"."status" in ('queued', 'fetching_vault', 'starting_proxy', 'starting_sandboxes', 'wiring', 'running', 'finishing', 'finished', 'stopped', 'failed'))
);
--> statement-breakpoint
CREATE TABLE "sandboxes" (
	"id" text PRIMARY KEY NOT NULL,
	"run_id" text NOT NULL,
	"kind" text NOT NULL,
	"task_index" integer,
	"backend" text NOT NULL,
	"status" text DEFAULT 'creating' NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"destroyed_at" timestamp with time zone
);
--> statement-breakpoint
ALTER TABLE "audit_batches" ADD CONSTRAINT "audit_batches_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "public"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "blocked_host_log" ADD CONSTRAINT "blocked_host_log_user_id_users_id_fk" FOREIGN KEY ("user_id") REFERENCES "public"."users"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "blocked_host_log" ADD CONSTRAINT "blocked_host_log_environment_id_environments_id_fk" FOREIGN KEY ("environment_id") REFERENCES "public"."environments"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "blocked_host_log" ADD CONSTRAINT "blocked_host_log_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "public"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "egress_route_log" ADD CONSTRAINT "egress_route_log_environment_id_environments_id_fk" FOREIGN KEY ("environment_id") REFERENCES "public"."environments"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "egress_route_log" ADD CONSTRAINT "egress_route_log_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "public"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "run_events" ADD CONSTRAINT "run_events_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "public"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "runs" ADD CONSTRAINT "runs_user_id_users_id_fk" FOREIGN KEY ("user_id") REFERENCES "public"."users"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "runs" ADD CONSTRAINT "runs_environment_id_environments_id_fk" FOREIGN KEY ("environment_id") REFERENCES "public"."environments"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "sandboxes" ADD CONSTRAINT "sandboxes_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "public"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "blocked_host_log_environment_last_seen" ON "blocked_host_log" USING btree ("environment_id","last_seen");--> statement-breakpoint
CREATE UNIQUE INDEX "run_events_run_key" ON "run_events" USING btree ("run_id","key");--> statement-breakpoint
CREATE INDEX "run_events_run_id" ON "run_events" USING btree ("run_id","id");--> statement-breakpoint
CREATE INDEX "runs_environment_created" ON "runs" USING btree ("environment_id","created_at");--> statement-breakpoint
CREATE INDEX "sandboxes_run" ON "sandboxes" USING btree ("run_id");