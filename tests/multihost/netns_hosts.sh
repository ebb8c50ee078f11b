#!/usr/bin/env bash
# netns_hosts.sh: hosts made of network namespaces, for running MPI "across machines" on one.
#
#   netns_hosts.sh up N DIR    makes N hosts; writes DIR/env (source it) and DIR/id
#   netns_hosts.sh down DIR    removes what `up` made (safe to repeat; also after a failed up)
#   netns_hosts.sh check       exit 0 where hosts can be made, else prints why and exits 77
#
# Each host is a namespace (dmh<ID>h<i>) with a veth whose root end is on a bridge
# (dmh<ID>b); the root namespace has the subnet's .1 on the bridge (mpirun listens there for
# the daemons) and host i has .(10+i). The subnet is a 10.211.X.0/24 that no interface of the
# root namespace uses (X picked from the pid), so runs side by side do not collide; only
# these addresses are ever used. Loopback is up in every namespace.
# DIR/env exports:
#   DMC_NETNS_HOSTS   "ADDR=NAMESPACE ..." (what netns_agent.sh maps host names with)
#   DMC_NETNS_ADDRS   the hosts' addresses, comma separated
#   DMC_NETNS_SUBNET  the subnet, CIDR
#   DMC_NETNS_MPIRUN  an mpirun command line over the hosts: the agent instead of ssh, TCP
#                     forced (btl tcp,self: no shared memory between ranks), the OOB and the
#                     BTL on the subnet, ranks dealt round-robin over the hosts (--map-by node)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

why_not() {
    [ "$(id -u)" -eq 0 ] || { echo "not root: network namespaces need CAP_NET_ADMIN"; return; }
    command -v ip >/dev/null 2>&1 || { echo "no ip (iproute2)"; return; }
    command -v mpirun >/dev/null 2>&1 || { echo "no mpirun (openmpi-bin)"; return; }
    local probe="dmhprobe$$"
    if ! ip netns add "$probe" 2>/dev/null; then echo "ip netns add fails here (no netns support?)"; return; fi
    local why=""
    ip link add "${probe}a" type veth peer name "${probe}b" 2>/dev/null || why="cannot make a veth pair here"
    ip link del "${probe}a" 2>/dev/null || true
    # what the agent does: enter the namespace (a mount namespace too) and a UTS namespace
    [ -n "$why" ] || ip netns exec "$probe" unshare --uts hostname "$probe" >/dev/null 2>&1 || \
        why="cannot enter a namespace with a host name of its own (ip netns exec, unshare --uts)"
    ip netns del "$probe" 2>/dev/null || true
    [ -z "$why" ] || echo "$why"
}

cmd="${1:-}"
case "$cmd" in
check)
    why="$(why_not)"
    if [ -n "$why" ]; then echo "SKIP: no hosts of network namespaces for MPI here: $why"; exit 77; fi
    exit 0 ;;
up)
    n="$2"; dir="$3"
    mkdir -p "$dir"
    id="$(printf '%04x' $(( ($$ + RANDOM) % 65536 )))"
    echo "$id" > "$dir/id"
    # a /24 of 10.211.0.0/16 that no interface here has
    used="$(ip -4 -o addr show | awk '{print $4}')"
    x=$(( $$ % 256 )); tries=0
    while grep -q "^10\.211\.$x\." <<<"$used"; do
        x=$(( (x + 1) % 256 )); tries=$((tries + 1))
        [ $tries -lt 256 ] || { echo "netns_hosts: no free /24 in 10.211.0.0/16" >&2; exit 1; }
    done
    net="10.211.$x"
    echo "$net" > "$dir/net"
    br="dmh${id}b"
    ip link add "$br" type bridge
    ip addr add "$net.1/24" dev "$br"
    ip link set "$br" up
    hosts=(); addrs=()
    for i in $(seq 1 "$n"); do
        ns="dmh${id}h$i"
        ip netns add "$ns"
        ip link add "dmh${id}v$i" type veth peer name "dmh${id}p$i"
        ip link set "dmh${id}p$i" netns "$ns"
        ip link set "dmh${id}v$i" master "$br"
        ip link set "dmh${id}v$i" up
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "dmh${id}p$i" name eth0
        ip -n "$ns" addr add "$net.$((10 + i))/24" dev eth0
        ip -n "$ns" link set eth0 up
        hosts+=("$net.$((10 + i))=$ns"); addrs+=("$net.$((10 + i))")
    done
    # the veths are up once both ends are (the bridge, STP off, forwards at once)
    for i in $(seq 1 "$n"); do
        ok=0
        for _ in $(seq 1 50); do
            if ip -n "dmh${id}h$i" -o link show eth0 | grep -q 'LOWER_UP'; then ok=1; break; fi
            sleep 0.1
        done
        [ $ok = 1 ] || { echo "netns_hosts: host $i's link does not come up" >&2; exit 1; }
    done
    addr_list="$(IFS=,; echo "${addrs[*]}")"
    cat > "$dir/env" <<ENV
export DMC_NETNS_HOSTS="${hosts[*]}"
export DMC_NETNS_ADDRS="$addr_list"
export DMC_NETNS_SUBNET="$net.0/24"
export DMC_NETNS_MPIRUN="mpirun --allow-run-as-root --oversubscribe --host $addr_list --map-by node --mca plm_rsh_agent $here/netns_agent.sh --mca plm_rsh_no_tree_spawn 1 --mca btl tcp,self --mca btl_tcp_if_include $net.0/24 --mca oob_tcp_if_include $net.0/24"
ENV
    ;;
down)
    dir="$2"
    [ -f "$dir/id" ] || exit 0
    id="$(cat "$dir/id")"
    for ns in $(ip netns list | awk '{print $1}' | grep "^dmh${id}h" || true); do
        # whatever still runs in the host (a rank, an orted) goes with it
        pids="$(ip netns pids "$ns" 2>/dev/null || true)"
        # shellcheck disable=SC2086 # one pid a word
        [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
    for l in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep "^dmh${id}" || true); do
        ip link del "$l" 2>/dev/null || true
    done
    rm -f "$dir/id" "$dir/env" "$dir/net"
    ;;
*)
    echo "usage: $0 up N DIR | down DIR | check" >&2; exit 2 ;;
esac
