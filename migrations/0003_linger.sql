ALTER TABLE "runs" DROP CONSTRAINT "runs_status";--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "linger_seconds" integer;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "linger_until" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "runs" ADD COLUMN "linger_paused_at" timestamp with time zone;--> statement-breakpoint
ALTER TABLE "sandboxes" ADD COLUMN "routing" text;--> statement-breakpoint
ALTER TABLE "runs" ADD CONSTRAINT "runs_linger_seconds" CHECK ("runs"."linger_seconds" between 0 and 86400);--> statement-breakpoint
ALTER TABLE "runs" ADD CONSTRAINT "runs_status" CHECK ("runs"."status" in ('queued', 'fetching_vault', 'starting_proxy', 'starting_sandboxes', 'wiring', 'running', 'finishing', 'lingering', 'finished', 'stopped', 'failed'));