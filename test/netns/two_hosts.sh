#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two hosts on one machine: network namespaces joined by a veth pair, each with a host name of
# its own; ranks start from env:// variables (as torchrun sets them) and talk over Gloo/TCP.
# Usage: two_hosts.sh PROGRAM [RANKS_PER_HOST]. Exits 77 (skipped) where namespaces are not allowed.
set -u
prog=$1
. "$(dirname "$0")/../common/time_scale.sh"
per_host=${2:-2}
world=$((per_host * 2))
tag=hora$$
nsA=${tag}a nsB=${tag}b
addrA=10.211.$(($$ % 250)).1 addrB=10.211.$(($$ % 250)).2
port=$((20000 + $$ % 20000))

cleanup() {
  ip netns del "$nsA" 2>/dev/null
  ip netns del "$nsB" 2>/dev/null
}
trap cleanup EXIT

skip() { echo "SKIP: $*"; exit 77; }
ip netns add "$nsA" 2>/dev/null || skip "cannot create network namespaces here (need CAP_NET_ADMIN)"
ip netns add "$nsB" || skip "cannot create a second network namespace"
ip link add "${tag}x" type veth peer name "${tag}y" 2>/dev/null || skip "cannot create a veth pair"
ip link set "${tag}x" netns "$nsA" && ip link set "${tag}y" netns "$nsB" || skip "cannot move veth ends"
ip -n "$nsA" addr add "$addrA/24" dev "${tag}x" && ip -n "$nsB" addr add "$addrB/24" dev "${tag}y" || exit 1
for ns in "$nsA" "$nsB"; do
  ip -n "$ns" link set lo up
done
ip -n "$nsA" link set "${tag}x" up && ip -n "$nsB" link set "${tag}y" up || exit 1
unshare --uts true 2>/dev/null || skip "cannot create UTS namespaces for per-host names"

# Ranks [0, per_host) on host A (the master), the rest on host B. Local ranks are not given:
# hora derives them from the host names, as it would on two machines.
pids=()
for ((r = 0; r < world; ++r)); do
  if ((r < per_host)); then ns=$nsA host=hosta; else ns=$nsB host=hostb; fi
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$host" \
    env -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE -u PMIX_RANK \
    MASTER_ADDR="$addrA" MASTER_PORT="$port" RANK="$r" WORLD_SIZE="$world" \
    HORA_TIMEOUT_S="$(scaled 60)" "$prog" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do
  wait "$p" || status=1
done
exit $status
