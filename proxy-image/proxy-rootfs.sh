#!/bin/sh
# The proxy image's whole filesystem, assembled in <root> from this build stage (proxy-image/
# Dockerfile's `rootfs`, Debian with node, nftables, busybox-static, ca-certificates and binutils
# installed) and the programs' bundles in <dist>:
#   sh proxy-rootfs.sh <dist> <root>
# The image is then <root> alone (FROM scratch): only what the proxy, the wiring program and
# bw-init run, so that a node pulls a sixth of what it did. Each program comes with the shared
# libraries ldd says it loads, at their own paths, in Debian's merged-/usr layout.
set -eu
dist="$1"
root="$2"

mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs"
for dir in bin sbin lib lib64; do
  mkdir -p "$root/usr/$dir"
  ln -s "usr/$dir" "$root/$dir"
done

# A file at the same path under <root>, symlinks followed (through <root>'s own /lib -> usr/lib).
put() {
  [ -e "$root$1" ] && return 0
  mkdir -p "$root$(dirname "$1")"
  cp -L "$1" "$root$1"
}
# The loader and libraries a program or shared object loads (ldd's absolute paths).
libs_of() {
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
}
with_libs() {
  for lib in $(libs_of "$1"); do put "$lib"; done
}

# node, stripped of its symbols (a fifth of its size; the public image's are not used by
# anything here). No file capability: every container of this image drops ALL, and the kernel
# refuses to exec a file whose capability is outside the bounding set; the proxy listens on the
# unprivileged ports the control plane gives it (PROXY_PORTS).
node="$(readlink -f /usr/local/bin/node)"
strip --strip-all -o "$root/usr/local/bin/node" "$node"
with_libs "$node"

# The programs: the proxy and its koffi (its binary's libraries too), the wiring program, and the
# programs a sandbox0 work pod's init container lays out in /bw/tools (below).
mkdir -p "$root/opt/benchwright"
for program in proxy wiring exec-runner unpack collect layer; do
  cp "$dist/$program.cjs" "$root/opt/benchwright/"
done
cp -R "$dist/node_modules" "$root/opt/benchwright/node_modules"
for binary in "$root"/opt/benchwright/node_modules/koffi/build/koffi/*/*.node; do with_libs "$binary"; done

# bw-init (sandbox0's init container, docs/sandbox0.md): /bin/sh and the few tools it runs, from
# one static busybox; nft, for its catch-all redirect.
cp /bin/busybox "$root/usr/bin/busybox"
for applet in sh awk cat chmod cp false grep head id ls mkdir sleep; do ln -s busybox "$root/usr/bin/$applet"; done
put /usr/sbin/nft
with_libs /usr/sbin/nft
cp "$dist/bw-init.sh" "$root/usr/local/bin/bw-init"

# The programs by the names the sandbox broker uses in its exec calls: bw-proxy (the proxy),
# bw-proxy-view (prints the running proxy's view as one JSON line: the control plane runs it to
# inspect a lingering run's proxy) and bw-wiring (an init container runs it from this image on
# Kubernetes; the local backend mounts proxy-image/dist instead).
printf '#!/bin/sh\nexec node /opt/benchwright/proxy.cjs "$@"\n' >"$root/usr/local/bin/bw-proxy"
printf '#!/bin/sh\nexec node /opt/benchwright/proxy.cjs view "$@"\n' >"$root/usr/local/bin/bw-proxy-view"
printf '#!/bin/sh\nexec node /opt/benchwright/wiring.cjs "$@"\n' >"$root/usr/local/bin/bw-wiring"

# /opt/benchwright/tools, what bw-init tools copies into a work pod's /bw/tools: node, its loader
# and libraries (the work image may have neither node nor the same libc), the exec
# runner, the wiring program, bw-unpack and bw-collect (bundles in, artifacts out, as the pod's
# uid), bw-layer (a setup image's capture: the working directory as a tar), and /bin/sh wrappers by
# the paths the sandbox0 backend and the exec runner use. Hard links: stored once in the layer.
t="$root/opt/benchwright/tools"
mkdir -p "$t/bin" "$t/lib"
ln "$root/usr/local/bin/node" "$t/node"
for lib in $(libs_of "$node"); do
  case "$lib" in
  */ld-linux*) ln "$root$lib" "$t/lib/ld.so" ;;
  *) ln "$root$lib" "$t/lib/" ;;
  esac
done
for program in wiring exec-runner unpack collect layer; do
  ln "$root/opt/benchwright/$program.cjs" "$t/"
done
printf '#!/bin/sh\nexec /bw/tools/lib/ld.so --library-path /bw/tools/lib /bw/tools/node "$@"\n' >"$t/bin/node"
printf '#!/bin/sh\nBW_NODE=/bw/tools/bin/node BW_EXEC_DIR=/bw/run/exec exec /bw/tools/bin/node /bw/tools/exec-runner.cjs "$@"\n' >"$t/bin/bw-exec"
for program in wiring unpack collect layer; do
  printf '#!/bin/sh\nexec /bw/tools/bin/node /bw/tools/%s.cjs "$@"\n' "$program" >"$t/bin/bw-$program"
done
chmod 755 "$root"/usr/local/bin/bw-* "$t"/bin/*

# The users (root; the proxy's, uid 10001, the pods' uid), name lookups as Debian has them, the
# system CA bundle (bw-init tools hands it to the work pod), and the writable directories.
printf 'root:x:0:0:root:/root:/bin/sh\nbenchwright:x:10001:10001::/nonexistent:/bin/false\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nbenchwright:x:10001:\nnogroup:x:65534:\n' >"$root/etc/group"
cp /etc/nsswitch.conf "$root/etc/nsswitch.conf"
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
mkdir -p -m 1777 "$root/tmp"
mkdir -p "$root/root" "$root/var/spool/benchwright"
chown 10001:10001 "$root/var/spool/benchwright"
# Where the loader looks first: a cache of <root>'s own libraries (koffi loads libc.so.6 by name).
: >"$root/etc/ld.so.conf"
ldconfig -r "$root"

# The result runs: node, and the tools' node through their own loader.
chroot "$root" node -e 'process.exit(0)'
chroot "$root" /opt/benchwright/tools/lib/ld.so --library-path /opt/benchwright/tools/lib /opt/benchwright/tools/node -e 'process.exit(0)'
chroot "$root" nft --version >/dev/null
