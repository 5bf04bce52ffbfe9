#!/bin/bash
# rsh agent for Open MPI in netns-cluster (mpirun --mca plm_rsh_agent netns_rsh.sh): where
# ssh would log in to host 10.251.0.I, this runs the command in namespace tjn-hI instead.
# Usage (by mpirun): netns_rsh.sh [options] HOST COMMAND...
while [[ ${1:-} = -* ]]; do shift; done
host=${1:?netns_rsh.sh: no host}
shift
case $host in
  10.251.0.*) ns=tjn-h${host##*.} ;;
  *) echo "netns_rsh.sh: $host is not a netns-cluster host (10.251.0.I)" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" /bin/sh -c "$*"
