#!/usr/bin/env bash
# hybrid_train on the nodes of a hostfile, started by mpirun from the first of them.
#
#   HT_IFACE=eth0 bash cluster/mpirun/two-node.sh hostfile configs/gpt_tiny.toml --training.device=cuda
#
# Needs ssh without a password from this node to the others, and hybrid_train, the config and the
# data set at the same paths on every node. HT_IFACE: the network between the nodes, as an
# interface name or a CIDR block (10.0.0.0/24) for Open MPI; NCCL_SOCKET_IFNAME: the interface
# name for NCCL (default: HT_IFACE when it is a name). HYBRID_TRAIN: the binary (default: on PATH).
# cluster/mpirun/test-two-hosts.sh runs this script across two network namespaces.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "two-node.sh: give a hostfile and a config, e.g. cluster/mpirun/two-node.sh hostfile configs/quickstart.toml" >&2
  exit 2
fi
hostfile=$1
shift
[ -r "$hostfile" ] || { echo "two-node.sh: cannot read the hostfile $hostfile; copy cluster/mpirun/hostfile.example" >&2; exit 2; }
# Every slot of the hostfile is a rank.
ranks=$(awk '!/^#/ { for (i = 2; i <= NF; ++i) if ($i ~ /^slots=/) { split($i, s, "="); n += s[2] } } END { print n + 0 }' "$hostfile")
[ "$ranks" -gt 0 ] || { echo "two-node.sh: $hostfile gives no slots; write lines like 'node1 slots=8'" >&2; exit 2; }
iface=${HT_IFACE:-}
nccl_iface=${NCCL_SOCKET_IFNAME:-}
if [ -z "$nccl_iface" ] && [ -n "$iface" ] && [[ "$iface" != */* ]]; then nccl_iface=$iface; fi
args=(-np "$ranks" --hostfile "$hostfile" --map-by slot --bind-to none -x PATH -x LD_LIBRARY_PATH)
# Without these, Open MPI and NCCL try every interface, docker0 and virbr0 included, and hang or
# crawl when one is not routed between the nodes.
if [ -n "$iface" ]; then args+=(--mca btl_tcp_if_include "$iface" --mca oob_tcp_if_include "$iface"); fi
if [ -n "$nccl_iface" ]; then args+=(-x NCCL_SOCKET_IFNAME="$nccl_iface"); fi
args+=(-x NCCL_DEBUG="${NCCL_DEBUG:-WARN}")
echo "two-node.sh: mpirun ${args[*]} ${HYBRID_TRAIN:-hybrid_train} $*"
exec mpirun "${args[@]}" "${HYBRID_TRAIN:-hybrid_train}" "$@"
