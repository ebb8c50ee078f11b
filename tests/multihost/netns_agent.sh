#!/usr/bin/env bash
# netns_agent.sh [SSH OPTIONS] HOST COMMAND...: what Open MPI's mpirun calls instead of ssh
# (--mca plm_rsh_agent) to start its daemon on HOST: runs COMMAND, as ssh would on the remote
# host (one shell command line, the words joined by spaces), inside the network namespace
# that $DMC_NETNS_HOSTS ("ADDR=NAMESPACE ...", written by netns_hosts.sh) maps HOST to, and
# in a UTS namespace of its own whose host name is the namespace's name. Each host then has
# a name of its own, as machines do: with one name for all, Open MPI's daemons on the hosts
# (which name their session directories in the shared /tmp after the host) at times did not
# all start (3 launches in 40 hung waiting for a daemon; none in 200 with their own names).
set -euo pipefail
# options ssh would get: those of ssh that take a value consume it
while [ $# -gt 0 ]; do
    case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
    esac
done
[ $# -ge 2 ] || { echo "netns_agent: usage: $0 [ssh options] HOST COMMAND..." >&2; exit 255; }
host="$1"; shift
ns=""
for pair in ${DMC_NETNS_HOSTS:-}; do
    [ "${pair%%=*}" = "$host" ] && ns="${pair#*=}"
done
[ -n "$ns" ] || { echo "netns_agent: no namespace for host $host (DMC_NETNS_HOSTS: ${DMC_NETNS_HOSTS:-unset})" >&2; exit 255; }
# shellcheck disable=SC2016 # $0 and $1 are the inner shell's
exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$0" && exec /bin/sh -c "$1"' "$ns" "$*"
