CREATE TABLE "idempotency_keys" (
	"environment_id" text NOT NULL,
	"key" text NOT NULL,
	"request_digest" text NOT NULL,
	"response_status" integer,
	"response_headers" jsonb,
	"response_ciphertext" text,
	"created_at" timestamp with time zone DEFAULT now() NOT NULL,
	"completed_at" timestamp with time zone,
	CONSTRAINT "idempotency_keys_environment_id_key_pk" PRIMARY KEY("environment_id","key")
);
--> statement-breakpoint
ALTER TABLE "idempotency_keys" ADD CONSTRAINT "idempotency_keys_environment_id_environments_id_fk" FOREIGN KEY ("environment_id") REFERENCES "public"."environments"("id") ON DELETE cascade ON UPDATE no action;--> statement-breakpoint
CREATE INDEX "idempotency_keys_created" ON "idempotency_keys" USING btree ("created_at");