# syntax=docker/dockerfile:1.7
# The E2B template of a run's WORK, TASK and ORCHESTRATOR sandboxes (E2B_WORK_TEMPLATE). E2B builds
# it through its API:
#   npm run e2b:templates    (E2B_API_KEY in the environment; docs/e2b.md)
# scripts/lib/e2b-templates.ts runs the build stage here and gives E2B the final stage as steps.
# What the e2b backend needs in it (docs/e2b.md): node (its programs), the wiring program, the exec
# runner, the bridge's local end, bw-unpack and bw-collect (bundles in, artifacts out), iptables
# (catch-all's redirect), prlimit (util-linux: the execute stage's pids limit), and the four
# scripts below.
# The agent's own toolchain is python3 (with pip and venv, and Debian's requests and httpx), git
# and curl; add what your benchmarks need.
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
# No sudo: the execute stage runs as E2B's `user`, who must never become root (root could rewrite
# the hosts file, the one thing that sends named hosts to the proxy under default routing). E2B's
# template build installs sudo and gives `user` sudo AFTER this file, so this alone is not enough:
# the backend runs bw-drop-root (below) in every sandbox at create, then bw-check-user as `user`,
# and refuses the sandbox if `user` can still become root.
RUN apt-get update && apt-get install -y --no-install-recommends \
      ca-certificates iptables python3 python3-pip python3-venv python3-requests python3-httpx git curl \
 && (apt-get purge -y sudo || true) && rm -f /etc/sudoers.d/* && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/proxy-image/dist/wiring.cjs /src/proxy-image/dist/exec-runner.cjs /src/proxy-image/dist/e2b-bridge.cjs /src/proxy-image/dist/unpack.cjs /src/proxy-image/dist/collect.cjs /src/proxy-image/dist/layer.cjs /opt/benchwright/
RUN printf '#!/bin/sh\nexec node /opt/benchwright/wiring.cjs "$@"\n' > /usr/local/bin/bw-wiring \
 && printf '#!/bin/sh\nexec node /opt/benchwright/exec-runner.cjs "$@"\n' > /usr/local/bin/bw-exec \
 && printf '#!/bin/sh\nexec node /opt/benchwright/e2b-bridge.cjs "$@"\n' > /usr/local/bin/bw-bridge \
 && printf '#!/bin/sh\nexec node /opt/benchwright/unpack.cjs "$@"\n' > /usr/local/bin/bw-unpack \
 && printf '#!/bin/sh\nexec node /opt/benchwright/collect.cjs "$@"\n' > /usr/local/bin/bw-collect \
 && printf '#!/bin/sh\nexec node /opt/benchwright/layer.cjs "$@"\n' > /usr/local/bin/bw-layer \
 && chmod 755 /usr/local/bin/bw-wiring /usr/local/bin/bw-exec /usr/local/bin/bw-bridge /usr/local/bin/bw-unpack /usr/local/bin/bw-collect /usr/local/bin/bw-layer \
 && mkdir -p -m 1777 /var/lib/bw-exec && mkdir -m 0700 /var/lib/bw-exec/0

# Run as root at create: takes every way to root away from `user`.
COPY --chmod=755 <<'EOF' /usr/local/bin/bw-drop-root
#!/bin/sh
set -eu
rm -f /etc/sudoers.d/*
if [ -f /etc/sudoers ]; then sed -i '/^[[:space:]]*user[[:space:]]/d;/^[[:space:]]*%sudo[[:space:]]/d;/^[[:space:]]*%admin[[:space:]]/d' /etc/sudoers; fi
for g in sudo admin wheel adm disk; do gpasswd -d user "$g" >/dev/null 2>&1 || true; done
for b in /usr/bin/sudo /usr/bin/su /bin/su /usr/bin/pkexec /usr/bin/newgrp /usr/bin/chsh /usr/bin/chfn; do
  if [ -e "$b" ]; then chmod u-s,g-s "$b"; fi
done
echo ok
EOF

# Run as root at create: the working directory of every backend (/home/sandbox; $BW_OUT is under
# it), the execute user's. E2B makes `user` after this file ran, so not in a RUN here.
COPY --chmod=755 <<'EOF' /usr/local/bin/bw-workdir
#!/bin/sh
set -eu
install -d -o user -g user -m 0755 /home/sandbox
echo ok
EOF

# Run as `user` at create: exit 0 only if it cannot become root nor touch what routes its traffic.
COPY --chmod=755 <<'EOF' /usr/local/bin/bw-check-user
#!/bin/sh
[ "$(id -u)" != 0 ] || { echo "the execute user is root"; exit 1; }
if sudo -n true 2>/dev/null; then echo "the execute user can sudo"; exit 1; fi
if su -c true root </dev/null >/dev/null 2>&1; then echo "the execute user can su"; exit 1; fi
for f in /etc/hosts /etc/resolv.conf /var/lib/bw-exec/0; do
  if [ -w "$f" ]; then echo "the execute user can write $f"; exit 1; fi
done
echo ok
EOF

# Run as root at create under catch-all routing: every TCP connection to 80 or 443 that anyone but
# root makes goes to the bridge's local end (127.0.0.1:443/80, root's own), wherever it was meant
# to go. This only routes: E2B's firewall is what lets nothing but the proxy's bridge host out.
COPY --chmod=755 <<'EOF' /usr/local/bin/bw-redirect
#!/bin/sh
set -eu
iptables -w -t nat -N BW_REDIRECT 2>/dev/null || iptables -w -t nat -F BW_REDIRECT
iptables -w -t nat -A BW_REDIRECT -d 127.0.0.0/8 -j RETURN
iptables -w -t nat -A BW_REDIRECT -m owner --uid-owner 0 -j RETURN
iptables -w -t nat -A BW_REDIRECT -p tcp --dport 443 -j REDIRECT --to-ports 443
iptables -w -t nat -A BW_REDIRECT -p tcp --dport 80 -j REDIRECT --to-ports 80
iptables -w -t nat -C OUTPUT -p tcp -j BW_REDIRECT 2>/dev/null || iptables -w -t nat -A OUTPUT -p tcp -j BW_REDIRECT
# No IPv6 way around it (E2B's ALL_TRAFFIC is 0.0.0.0/0).
if command -v ip6tables >/dev/null; then
  ip6tables -w -C OUTPUT -o lo -j ACCEPT 2>/dev/null || ip6tables -w -A OUTPUT -o lo -j ACCEPT
  ip6tables -w -P OUTPUT DROP
fi
echo ok
EOF
# No start command: the broker starts the bridge (as root, at create) itself.
