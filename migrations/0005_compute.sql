CREATE TABLE "compute_capabilities" (
	"id" text PRIMARY KEY NOT NULL,
	"run_id" text NOT NULL,
	"holder_sandbox_id" text NOT NULL,
	"token_hash" text NOT NULL,
	"expires_at" timestamp with time zone NOT NULL,
	"revoked_at" timestamp with time zone,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "compute_capabilities_token_hash_unique" UNIQUE("token_hash")
);
--> statement-breakpoint
CREATE TABLE "image_builds" (
	"id" text PRIMARY KEY NOT NULL,
	"environment_id" text NOT NULL,
	"content_hash" text NOT NULL,
	"repository" text NOT NULL,
	"tag" text NOT NULL,
	"status" text DEFAULT 'pending' NOT NULL,
	"digest" text,
	"push_run_id" text,
	"push_expires_at" timestamp with time zone,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"built_at" timestamp with time zone
);
--> statement-breakpoint
ALTER TABLE "compute_capabilities" ADD CONSTRAINT "compute_capabilities_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "public"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "image_builds" ADD CONSTRAINT "image_builds_environment_id_environments_id_fk" FOREIGN KEY ("environment_id") REFERENCES "public"."environments"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "image_builds" ADD CONSTRAINT "image_builds_push_run_id_runs_id_fk" FOREIGN KEY ("push_run_id") REFERENCES "public"."runs"("id") ON DELETE set null ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "compute_capabilities_run" ON "compute_capabilities" USING btree ("run_id");--> statement-breakpoint
CREATE UNIQUE INDEX "image_builds_environment_hash" ON "image_builds" USING btree ("environment_id","content_hash");