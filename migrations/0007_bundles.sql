CREATE TABLE "bundles" (
	"environment_id" text NOT NULL,
	"sha256" text NOT NULL,
	"size" bigint NOT NULL,
	"files" integer NOT NULL,
	"unpacked_bytes" bigint NOT NULL,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	CONSTRAINT "bundles_environment_id_sha256_pk" PRIMARY KEY("environment_id","sha256"),
	CONSTRAINT "bundles_sha256" CHECK ("bundles"."sha256" ~ '^[0-9a-f]{64}$')
);
--> statement-breakpoint
ALTER TABLE "bundles" ADD CONSTRAINT "bundles_environment_id_environments_id_fk" FOREIGN KEY ("environment_id") REFERENCES "public"."environments"("id") ON DELETE cascade ON UPDATE no action;