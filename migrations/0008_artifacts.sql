CREATE TABLE "run_artifacts" (
	"id" text PRIMARY KEY NOT NULL,
	"run_id" text NOT NULL,
	"environment_id" text NOT NULL,
	"sandbox_id" text NOT NULL,
	"sandbox_name" text NOT NULL,
	"path" text NOT NULL,
	"size" bigint,
	"sha256" text,
	"cut_reason" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "run_artifacts_kept_or_cut" CHECK (("run_artifacts"."cut_reason" is null and "run_artifacts"."sha256" is not null and "run_artifacts"."size" is not null) or ("run_artifacts"."cut_reason" is not null and "run_artifacts"."sha256" is null))
);
--> statement-breakpoint
ALTER TABLE "run_artifacts" ADD CONSTRAINT "run_artifacts_run_id_runs_id_fk" FOREIGN KEY ("run_id") REFERENCES "public"."runs"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "run_artifacts" ADD CONSTRAINT "run_artifacts_environment_id_environments_id_fk" FOREIGN KEY ("environment_id") REFERENCES "public"."environments"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "run_artifacts_run_sandbox_path" ON "run_artifacts" USING btree ("run_id","sandbox_id","path");