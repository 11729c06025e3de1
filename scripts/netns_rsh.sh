#!/bin/sh
# mpirun's remote-shell agent for hosts that are network namespaces of this machine
# (`--mca plm_rsh_agent scripts/netns_rsh.sh`): called as `netns_rsh.sh HOST COMMAND…` for
# HOST = A.B.C.N, it runs COMMAND in the namespace "$BRIGADE_NETNS_PREFIX$N" as ssh would run
# it on the host (through a shell). Used by scripts/check_hosts_netns.sh.
host=$1
shift
ns="${BRIGADE_NETNS_PREFIX:?set BRIGADE_NETNS_PREFIX}${host##*.}"
ip netns list | grep -qw "^$ns" || { echo "netns_rsh: no host $host (namespace $ns)" >&2; exit 255; }
exec ip netns exec "$ns" /bin/sh -c "$*"
