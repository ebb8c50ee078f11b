#!/usr/bin/env bash
# with_hosts.sh N COMMAND...: runs COMMAND with N hosts made of network namespaces
# (netns_hosts.sh), removed again when it ends, fails or is stopped. COMMAND gets
# netns_hosts.sh's DMC_NETNS_* variables and DMC_TEST_MPIRUN (the mpirun over the hosts, which
# tests/spmd/test_equivalence.py launches with). Before, checks that mpirun places ranks on
# every host; after, that every host's link carried MPI traffic (the ranks spoke TCP across
# hosts, not through shared memory). Exit 77 (a meson skip), with the reason, where hosts
# cannot be made: not root, no ip, no netns support, no mpirun.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
n="$1"; shift
"$here/netns_hosts.sh" check || exit $?
dir="$(mktemp -d /tmp/dmc-netns-XXXXXX)"
child=""
# what COMMAND started and left (an mpirun whose dmc was killed) is in its session
# shellcheck disable=SC2317 # called by the trap
cleanup() {
    [ -z "$child" ] || pkill -KILL -s "$child" 2>/dev/null || true
    "$here/netns_hosts.sh" down "$dir"; rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
"$here/netns_hosts.sh" up "$n" "$dir" || { echo "FAIL: could not make $n hosts"; exit 1; }
# shellcheck disable=SC1091
. "$dir/env"
export DMC_TEST_MPIRUN="$DMC_NETNS_MPIRUN"
echo "hosts: $DMC_NETNS_HOSTS"
echo "launcher: $DMC_TEST_MPIRUN"
id="$(cat "$dir/id")"

# every host runs ranks, each in its own namespace (its own address)
# shellcheck disable=SC2086,SC2016 # the launcher is a command line; the inner shell expands
placed="$(timeout 60 $DMC_TEST_MPIRUN -np "$n" sh -c 'echo "$OMPI_COMM_WORLD_RANK $(ip -o -4 addr show eth0 | awk "{print \$4}")"' 2>&1)"
echo "$placed" | sed 's/^/placement: rank /'
for i in $(seq 1 "$n"); do
    echo "$placed" | grep -q " 10\.[0-9.]*\.$((10 + i))/24$" || { echo "FAIL: no rank ran on host $i"; exit 1; }
done

link_bytes() {
    echo $(( $(cat "/sys/class/net/dmh${id}v$1/statistics/rx_bytes") + $(cat "/sys/class/net/dmh${id}v$1/statistics/tx_bytes") ))
}
declare -a before
for i in $(seq 1 "$n"); do before[i]="$(link_bytes "$i")"; done
setsid "$@" &
child=$!
wait "$child"
status=$?
[ $status -eq 0 ] || exit $status
for i in $(seq 1 "$n"); do
    b=$(( $(link_bytes "$i") - ${before[$i]} ))
    echo "host $i's link carried $b bytes"
    [ $b -ge 65536 ] || { echo "FAIL: host $i's link carried $b bytes: its ranks did not talk across hosts"; exit 1; }
done
exit 0
