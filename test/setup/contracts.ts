import type { TestProject } from "vitest/node";
import { startRegistryContract } from "../contract/registry-server";

// Placeholder: the contract servers (Kubernetes, E2B, OCI registry) the worker tests' cloud
// backends talk to, started on loopback and provided to the tests.
export default async function setup(_project: TestProject) {
  await startRegistryContract(_project); // OCI registry (image build cache); closes with vitest
  return async () => {};
}
