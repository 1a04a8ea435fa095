# syntax=docker/dockerfile:1.7
# The E2B template of a run's PROXY sandbox (E2B_PROXY_TEMPLATE). E2B builds it through its API:
#   npm run e2b:templates    (E2B_API_KEY in the environment; docs/e2b.md)
# scripts/lib/e2b-templates.ts runs the build stage here and gives E2B the final stage as steps.
# The same proxy as Dockerfile, plus the two programs the e2b backend drives it with (docs/e2b.md):
# bw-exec, the exec runner (E2B keeps no output of a process: the runner keeps it in the sandbox),
# and bw-bridge, whose `serve` end is the only way the run's work sandboxes reach the proxy.
# The base: node 24 on Debian bookworm, with npm. `npm run images` passes a local build of the same
# (scripts/lib/node-base.ts); anywhere else the public image is the default.
ARG BASE_IMAGE=node:24-bookworm-slim
# The same build stage in all four Dockerfiles, so a layer-caching build makes it once.
FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY package.json package-lock.json ./
COPY proxy-image/package.json proxy-image/
COPY shared/package.json shared/
COPY egress-agent/package.json egress-agent/
# Only the proxy workspace's dependencies (esbuild is one), not the whole lockfile's.
RUN npm ci --workspace=proxy-image --ignore-scripts --no-audit --no-fund
COPY shared/policy shared/policy
COPY shared/contract shared/contract
COPY shared/archive shared/archive
COPY shared/node shared/node
COPY egress-agent/src egress-agent/src
COPY proxy-image/src proxy-image/src
COPY proxy-image/copy-koffi.mjs proxy-image/
RUN npm run build:proxy

FROM ${BASE_IMAGE}
# Nothing here listens on a privileged port (the proxy on 8443/8080 behind 127.0.0.1, the bridge
# on 8090), so no capability is given to anyone. sudo is removed for good measure: nothing of the
# agent runs in this sandbox, and the proxy's own user has no use for root.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
 && (apt-get purge -y sudo || true) && rm -f /etc/sudoers.d/* && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/proxy-image/dist/proxy.cjs /src/proxy-image/dist/exec-runner.cjs /src/proxy-image/dist/e2b-bridge.cjs /opt/benchwright/
# The programs by the names the sandbox broker uses. The runner's state: one private directory per
# uid under a sticky directory (root's made here; the others make their own on first use).
RUN printf '#!/bin/sh\nexec node /opt/benchwright/proxy.cjs "$@"\n' > /usr/local/bin/bw-proxy \
 && printf '#!/bin/sh\nexec node /opt/benchwright/proxy.cjs view "$@"\n' > /usr/local/bin/bw-proxy-view \
 && printf '#!/bin/sh\nexec node /opt/benchwright/exec-runner.cjs "$@"\n' > /usr/local/bin/bw-exec \
 && printf '#!/bin/sh\nexec node /opt/benchwright/e2b-bridge.cjs "$@"\n' > /usr/local/bin/bw-bridge \
 && chmod 755 /usr/local/bin/bw-proxy /usr/local/bin/bw-proxy-view /usr/local/bin/bw-exec /usr/local/bin/bw-bridge \
 && mkdir -p -m 1777 /var/lib/bw-exec && mkdir -m 0700 /var/lib/bw-exec/0
# No start command: the broker starts bw-bridge (at create) and bw-proxy (with the run's
# credentials in that one process's environment) itself. A template that started the proxy would
# start it without credentials, in every sandbox, before its run exists.
