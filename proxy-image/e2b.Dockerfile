# The E2B template of the proxy sandbox: the same image as Dockerfile (E2B builds from this file;
# run `e2b template build` from the repository root with -c proxy-image/e2b.toml).
FROM node:20-bookworm-slim AS build
WORKDIR /src
COPY package.json package-lock.json ./
COPY proxy-image/package.json proxy-image/
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY src/policy src/policy
COPY src/contract src/contract
COPY proxy-image/src proxy-image/src
RUN npm run build:proxy

FROM node:20-bookworm-slim
# Listen on 80/443 without running as root: the capability is on the node binary only.
RUN apt-get update && apt-get install -y --no-install-recommends libcap2-bin ca-certificates \
 && setcap cap_net_bind_service=+ep "$(readlink -f /usr/local/bin/node)" \
 && apt-get purge -y libcap2-bin && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin proxy \
 && mkdir -p /var/spool/benchwright && chown proxy /var/spool/benchwright
COPY --from=build /src/proxy-image/dist/proxy.cjs /opt/benchwright/proxy.cjs
# The wiring program, for work and task sandboxes' setup stage (an init container runs it from
# this image on Kubernetes; the local backend mounts proxy-image/dist instead).
COPY --from=build /src/proxy-image/dist/wiring.cjs /opt/benchwright/wiring.cjs
# The programs by the names the sandbox broker uses in its exec calls: bw-proxy (the proxy),
# bw-proxy-view (prints the running proxy's view as one JSON line: the control plane runs it to
# inspect a lingering run's proxy) and bw-wiring.
RUN printf '#!/bin/sh\nexec node /opt/benchwright/proxy.cjs "$@"\n' > /usr/local/bin/bw-proxy \
 && printf '#!/bin/sh\nexec node /opt/benchwright/proxy.cjs view "$@"\n' > /usr/local/bin/bw-proxy-view \
 && printf '#!/bin/sh\nexec node /opt/benchwright/wiring.cjs "$@"\n' > /usr/local/bin/bw-wiring \
 && chmod 755 /usr/local/bin/bw-proxy /usr/local/bin/bw-proxy-view /usr/local/bin/bw-wiring
USER proxy
EXPOSE 80 443 3128
# E2B starts the proxy with start_cmd in e2b.toml.
