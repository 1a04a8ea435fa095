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
*)
  echo "usage: bw-init tools | bw-init redirect <proxy-pod-ipv4>" >&2
  exit 2
  ;;
esac
