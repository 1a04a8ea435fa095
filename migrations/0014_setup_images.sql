CREATE TABLE "setup_images" (
	"id" text PRIMARY KEY NOT NULL,
	"environment_id" text NOT NULL,
	"key" text NOT NULL,
	"status" text NOT NULL,
	"backend" text NOT NULL,
	"inputs" jsonb NOT NULL,
	"digest" text,
	"repository" text,
	"size_bytes" bigint,
	"files" integer,
	"built_by_run_id" text,
	"built_at" timestamp with time zone,
	"last_used_at" timestamp with time zone,
	"builder_run_id" text,
	"builder_sandbox_id" text,
	"lease_until" timestamp with time zone,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL
);
--> statement-breakpoint
ALTER TABLE "setup_images" ADD CONSTRAINT "setup_images_environment_id_environments_id_fk" FOREIGN KEY ("environment_id") REFERENCES "public"."environments"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "setup_images" ADD CONSTRAINT "setup_images_built_by_run_id_runs_id_fk" FOREIGN KEY ("built_by_run_id") REFERENCES "public"."runs"("id") ON DELETE set null ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "setup_images" ADD CONSTRAINT "setup_images_builder_run_id_runs_id_fk" FOREIGN KEY ("builder_run_id") REFERENCES "public"."runs"("id") ON DELETE set null ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "setup_images_environment_key" ON "setup_images" USING btree ("environment_id","key");--> statement-breakpoint
CREATE INDEX "setup_images_environment_used" ON "setup_images" USING btree ("environment_id","last_used_at");