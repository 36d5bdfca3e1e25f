#!/usr/bin/env bash
# Create a Soft-RoCE (rdma_rxe) device on a network interface, so fs3's RDMA transport can run on
# machines without an RDMA NIC.
#
#   deploy/rxe-setup.sh IFACE [NAME]     e.g. deploy/rxe-setup.sh eth0        (NAME defaults to rxe0)
#
# Needs root, the kernel's rdma_rxe driver (CONFIG_RDMA_RXE) with RDMA netlink (CONFIG_INFINIBAND),
# and the `rdma` tool (iproute2). Idempotent: an rxe device already bound to IFACE is reported and kept.
# Exit status: 0 ready, 2 usage, 3 a tool is missing, 4 the kernel cannot do it, 5 creating it failed.
# Every command runs under a timeout (RXE_SETUP_TIMEOUT seconds, default 20), so the script never hangs.
set -u

prog=${0##*/}
fail() { local code=$1; shift; echo "$prog: $*" >&2; exit "$code"; }
run() { timeout "${RXE_SETUP_TIMEOUT:-20}" "$@"; }

[ $# -ge 1 ] && [ $# -le 2 ] || fail 2 "usage: $prog IFACE [NAME]"
iface=$1
name=${2:-rxe0}
[[ $name =~ ^[A-Za-z0-9_]+$ ]] || fail 2 "device name '$name' must be letters, digits and _"

command -v ip >/dev/null || fail 3 "the 'ip' tool is missing (apt-get install iproute2)"
command -v rdma >/dev/null || fail 3 "the 'rdma' tool is missing (apt-get install iproute2)"
run ip link show dev "$iface" >/dev/null 2>&1 || fail 2 "no network interface '$iface' (see: ip -br link)"
[ "$(id -u)" = 0 ] || fail 3 "creating an rxe device needs root"

# The kernel must speak RDMA netlink, or neither `rdma link add` nor any verbs device can work.
if ! out=$(run rdma link show 2>&1); then
    fail 4 "this kernel has no RDMA netlink support (rdma link show: ${out:-timed out}); it was built without CONFIG_INFINIBAND, so Soft-RoCE cannot be set up here. fs3 uses TCP on this machine (transport = \"auto\")."
fi

existing=$(printf '%s\n' "$out" | awk -v ifc="$iface" '$0 ~ ("netdev " ifc "( |$)") { split($2, a, "/"); print a[1]; exit }')
if [ -n "$existing" ]; then
    echo "$prog: $iface already has RDMA device '$existing'; nothing to do"
    exit 0
fi

if [ ! -d /sys/module/rdma_rxe ]; then
    command -v modprobe >/dev/null || fail 4 "rdma_rxe is not loaded and 'modprobe' is missing (apt-get install kmod)"
    if ! out=$(run modprobe rdma_rxe 2>&1); then
        fail 4 "cannot load the rdma_rxe kernel module: ${out:-timed out} (a kernel built with CONFIG_RDMA_RXE=m or =y is needed)"
    fi
fi

if ! out=$(run rdma link add "$name" type rxe netdev "$iface" 2>&1); then
    fail 5 "rdma link add $name type rxe netdev $iface failed: ${out:-timed out}"
fi

for _ in $(seq 50); do
    [ -d "/sys/class/infiniband/$name" ] && break
    sleep 0.1
done
[ -d "/sys/class/infiniband/$name" ] || fail 5 "$name was added but /sys/class/infiniband/$name did not appear"

echo "$prog: created $name on $iface"
run rdma link show "$name/1" 2>/dev/null || true
if command -v ibv_devices >/dev/null; then run ibv_devices || true; fi
echo "$prog: RoCE needs an IP address on $iface for its GID; fs3 picks a RoCE v2 IPv4 GID (rdma.gid_index = -1)"
