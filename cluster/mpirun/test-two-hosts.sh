#!/usr/bin/env bash
# Runs cluster/mpirun/two-node.sh across two hosts made on this machine: two network namespaces
# (own interfaces eth0, own host names node1 and node2) joined by a bridge, the hostfile naming
# their addresses, and mpirun reaching them through a remote-shell agent (`ip netns exec`, in
# place of ssh). The 2 ranks, one per host, must train as one rank with the same global batch
# (scripts/same_losses.py), and their all-reduce must have crossed the hosts' eth0, not shared
# memory. The model is the MLP without dropout: batch norm (the ConvNet's) normalizes each rank's
# half batch, so only a model without it can be held to the one-rank run's losses.
#
#   sudo bash cluster/mpirun/test-two-hosts.sh        (after scripts/build.sh; about a minute)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
bin=$repo/build/launcher/hybrid_train
say() { echo "test-two-hosts: $*"; }
fail() { say "FAILED: $*"; exit 1; }
if [ "$(id -u)" != 0 ]; then echo "test-two-hosts: run as root (it makes network namespaces)" >&2; exit 2; fi
[ -x "$bin" ] || { echo "test-two-hosts: $bin is missing; run scripts/build.sh first" >&2; exit 2; }
dir=$(mktemp -d /var/tmp/ht-two-hosts.XXXXXX)
bridge=htbr0
cleanup() {
  for n in 1 2; do ip netns del "ht-node$n" 2>/dev/null || true; done
  ip link del "$bridge" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
cleanup
mkdir -p "$dir"

# The network: 10.77.0.254 on the bridge (where mpirun listens), 10.77.0.1 and .2 in the hosts.
ip link add "$bridge" type bridge
ip addr add 10.77.0.254/24 dev "$bridge"
ip link set "$bridge" up
for n in 1 2; do
  ip netns add "ht-node$n"
  ip link add "ht-veth$n" type veth peer name eth0 netns "ht-node$n"
  ip link set "ht-veth$n" master "$bridge" up
  ip -n "ht-node$n" addr add "10.77.0.$n/24" dev eth0
  ip -n "ht-node$n" link set eth0 up
  ip -n "ht-node$n" link set lo up
done

# mpirun's remote shell: `agent HOST COMMAND...` runs COMMAND on HOST, as ssh would.
cat >"$dir/agent" <<'AGENT'
#!/usr/bin/env bash
host=$1
shift
n=${host##*.}
exec ip netns exec "ht-node$n" unshare --uts bash -c 'hostname "node$0"; exec bash -c "$1"' "$n" "$*"
AGENT
chmod +x "$dir/agent"
printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' >"$dir/hostfile"
export OMPI_MCA_plm_rsh_agent=$dir/agent OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rx_bytes() { ip netns exec "ht-node$1" cat /sys/class/net/eth0/statistics/rx_bytes; }

steps=100
job=(configs/quickstart.toml --model.name=mlp --model.dropout=0 --training.steps=$steps --checkpoint.interval=0
  --metrics.log_interval=1)
before=$(rx_bytes 2)
HT_IFACE=10.77.0.0/24 HYBRID_TRAIN="$bin" bash cluster/mpirun/two-node.sh "$dir/hostfile" "${job[@]}" \
  --job.output_dir="$dir/two" 2>&1 | tee "$dir/two.log" | grep -E "^(two-node|step [0-9]*0/|done|hybrid_train: error)" || true
grep -q "^done: " "$dir/two.log" || { tail -30 "$dir/two.log"; fail "the two-host job did not finish"; }
crossed=$(( $(rx_bytes 2) - before ))
"$bin" "${job[@]}" --job.output_dir="$dir/one" >/dev/null 2>&1
python3 scripts/same_losses.py "$dir/one" "$dir/two" || fail "2 ranks on 2 hosts did not train as 1 rank"
# Each step all-reduces every fp32 gradient: with 2 ranks, each receives at least half of them.
parameters=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['parameters'])" "$dir/two/summary.json")
[ "$crossed" -gt $((parameters * 4 / 2 * steps)) ] ||
  fail "only $crossed bytes reached node2's eth0 in $steps steps of $parameters gradients: the all-reduce did not cross the hosts"
say "2 ranks on node1 and node2 train as 1 rank; $((crossed / 1000000)) MB reached node2 over eth0 in $steps steps"
say "passed on $(date -u +%Y-%m-%d)"
