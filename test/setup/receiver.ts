import type { TestProject } from "vitest/node";
import { startNotificationReceiver } from "../fixtures/notification-receiver";
import "../fixtures/notification-receiver-contract";

// Starts the notification receiver the worker tests register as a notification URL, with the
// certificate test/setup/receiver-ca.ts made before the Worker's runtime started.

export default async function setup(project: TestProject) {
  const dir = process.env.BW_TEST_RECEIVER_TLS;
  if (!dir)
    throw new Error("BW_TEST_RECEIVER_TLS is not set: vitest.config.ts imports test/setup/receiver-ca first");
  const receiver = await startNotificationReceiver(dir);
  project.provide("notificationReceiver", receiver.url);
  return () => receiver.close();
}
