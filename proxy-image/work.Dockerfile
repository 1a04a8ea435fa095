# The root filesystem of a local sandbox (the `local` backend: docs/local-backend.md). The host
# agent exports this image's files once per image id into /var/lib/benchwright/rootfs/<id> and
# gives every work, task, orchestrator and proxy sandbox a writable overlay of its own over them.
#   npm run images            (or: npm run images -- work)
# What benchmarks commonly reach for: python3 with pip and venv and Debian's requests and httpx (a
# key read from the environment works through the proxy with no pip install: docs/user-guide.md,
# placeholders), node (the base's), git, curl, ps (procps) and the CA bundle. The setup stage (root of the sandbox's user namespace) installs the rest with
# apt or pip through the run's proxy; the execute stage never becomes root.
# The base: node 24 on Debian bookworm, with npm. `npm run images` passes a local build of the same
# (scripts/lib/node-base.ts); anywhere else the public image is the default.
ARG BASE_IMAGE=node:24-bookworm-slim
# The same build stage in all four Dockerfiles, so a layer-caching build makes it once. This image
# takes nothing from it (the agent mounts proxy-image/dist into each sandbox at /run/bw-image).
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
# No sudo (nothing here may make the execute stage root). apt runs its downloads as root: in a
# sandbox there is one root only (the user namespace's), and `_apt` is not mapped there.
RUN apt-get update && apt-get install -y --no-install-recommends \
      ca-certificates python3 python3-pip python3-venv python3-requests python3-httpx git curl procps \
 && (apt-get purge -y sudo || true) && rm -f /etc/sudoers.d/* && rm -rf /var/lib/apt/lists/* \
 && echo 'APT::Sandbox::User "root";' > /etc/apt/apt.conf.d/90benchwright-sandbox
# The sandbox's working directory and $BW_OUT's parent; the agent mounts a tmpfs over /home.
RUN mkdir -p /home/sandbox && chmod 1777 /home/sandbox
