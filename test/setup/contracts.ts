import type { TestProject } from "vitest/node";
import { startE2bContract } from "../contract/e2b-server";
import { startKubernetesContract } from "../contract/kubernetes-server";
import { startRegistryContract } from "../contract/registry-server";

// Placeholder: the contract servers (Kubernetes, E2B, OCI registry) the worker tests' cloud
// backends talk to, started on loopback and provided to the tests.
export default async function setup(_project: TestProject) {
  await startRegistryContract(_project); // an OCI registry that misbehaves; closes with vitest
  await startKubernetesContract(_project); // Kubernetes (sandbox0 backend); closes with vitest
  await startE2bContract(_project); // E2B (e2b backend); its sandboxes' processes die with vitest
  return async () => {};
}
