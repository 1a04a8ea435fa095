import { createApp } from "./app";
import { coordinatorStub } from "./coordinator/client";
import { reconcile } from "./reaper/reconcile";

export { SandboxBroker } from "./broker/sandbox-broker";
export { RunCoordinator } from "./coordinator/run-coordinator";
export { RunNotifier } from "./notifications/notifier";
export { TunnelRelay } from "./tunnel/relay";

// A proxy's ready call wakes its run's coordinator instead of waiting for its next poll.
const app = createApp({ onProxyReady: (env, runId) => coordinatorStub(env, runId).poke() });

export default {
  fetch: app.fetch,
  scheduled: (controller, env, ctx) => ctx.waitUntil(reconcile(env, controller.scheduledTime).then(() => {})),
} satisfies ExportedHandler<Env>;
