import { buildProxyImage } from "../../scripts/lib/local-stack";

// The host agent mounts proxy-image/dist (proxy.cjs, wiring.cjs) into every sandbox, so the
// suites that make sandboxes need it built from the current sources first.
export default function setup() {
  buildProxyImage();
}
