#!/bin/sh
# The init role of this image in a sandbox0 work/task/orchestrator pod (docs/sandbox0.md).
#
#   bw-init tools            As the sandbox's uid, no capability: copy node (with its own
#                            libraries and loader, so any work image can run it), the exec runner
#                            and the wiring program to /bw/tools (mounted read-only in the work
#                            container), the system CA bundle to /bw/run/ca/bundle.crt (the wiring
#                            appends the run CA to it) and make the runner's /bw/run/exec.
#   bw-init redirect <ip>    Catch-all routing only. As root with CAP_NET_ADMIN and nothing else,
#                            in the pod's network namespace, before any other container runs:
#                            TCP 80/443 to the proxy pod's 8080/8443, DNS to its resolver on 5353,
#                            everything else (other ports, UDP, IPv6) dropped. One nft transaction:
#                            all of it is installed or none, and a failure fails the pod.
#   bw-init sealer           The bw-seal container's main process (root, CAP_KILL): keeps a
#                            copy of the kubelet's /etc/resolv.conf from before any setup command
#                            ran, then waits.
#   bw-init seal <id>        Ends the setup stage: SIGKILL to every process of the pod whose cgroup
#                            names the setup container's runtime id <id>, and to every root
#                            process outside this container's cgroup (PID 1, the pause process,
#                            spared). Prints {"killed":N}. The backend then waits for the kubelet
#                            to report the setup container terminated: the runtime kills whatever
#                            is left in its cgroup when its main process dies.
#   bw-init hosts            After seal, or for a vault edit: one WiringReinstall JSON line on
#                            stdin (one line: a v4 exec cannot close stdin), handed to
#                            `bw-wiring reinstall`, which rewrites the hosts block of the pod's
#                            /etc/hosts; the resolver file is put back from the sealer's copy.
set -eu

case "${1:-}" in
tools)
  cp -R /opt/benchwright/tools/. /bw/tools/
  mkdir -p /bw/run/ca /bw/run/exec
  chmod 700 /bw/run/exec
  cp /etc/ssl/certs/ca-certificates.crt /bw/run/ca/bundle.crt
  chmod 644 /bw/run/ca/bundle.crt
  ;;
redirect)
  ip="${2:-}"
  if ! printf '%s\n' "$ip" | grep -Eq '^([0-9]{1,3}\.){3}[0-9]{1,3}$'; then
    echo "bw-init: redirect needs the proxy pod's IPv4 address" >&2
    exit 2
  fi
  nft -f - <<EOF
table ip benchwright {
  chain nat_out {
    type nat hook output priority -100; policy accept;
    oifname "lo" return
    tcp dport 80 dnat to $ip:8080
    tcp dport 443 dnat to $ip:8443
    udp dport 53 dnat to $ip:5353
    tcp dport 53 dnat to $ip:5353
  }
  chain filter_out {
    type filter hook output priority 0; policy drop;
    oifname "lo" accept
    ct state established,related accept
    ip daddr $ip tcp dport { 8080, 8443, 3128, 5353 } accept
    ip daddr $ip udp dport 5353 accept
  }
}
table ip6 benchwright6 {
  chain filter_out {
    type filter hook output priority 0; policy drop;
    oifname "lo" accept
  }
}
EOF
  nft list table ip benchwright >/dev/null
  ;;
sealer)
  mkdir -p /run/bw-seal
  cp /etc/resolv.conf /run/bw-seal/resolv.conf
  exec sleep infinity
  ;;
seal)
  id="${2:-}"
  if ! printf '%s\n' "$id" | grep -Eq '^[0-9a-f]{12,128}$'; then
    echo "bw-init: seal needs the setup container's runtime id (hex)" >&2
    exit 2
  fi
  own="$(cat /proc/self/cgroup)"
  killed=0
  for dir in /proc/[0-9]*; do
    pid="${dir#/proc/}"
    [ "$pid" = 1 ] && continue
    cgroup="$(cat "$dir/cgroup" 2>/dev/null)" || continue # gone meanwhile
    [ "$cgroup" = "$own" ] && continue # this container: the sealer and this script
    uid="$(awk '/^Uid:/ { print $2; exit }' "$dir/status" 2>/dev/null)" || continue
    case "$cgroup" in
    *"$id"*) ;;
    *) [ "$uid" = 0 ] || continue ;;
    esac
    if kill -KILL "$pid" 2>/dev/null; then killed=$((killed + 1)); fi
  done
  printf '{"killed":%d}\n' "$killed"
  ;;
hosts)
  if [ -f /run/bw-seal/resolv.conf ]; then cat /run/bw-seal/resolv.conf >/etc/resolv.conf; fi
  head -n 1 | bw-wiring reinstall
  ;;
*)
  echo "usage: bw-init tools | redirect <proxy-pod-ipv4> | sealer | seal <setup-container-id> | hosts" >&2
  exit 2
  ;;
esac
