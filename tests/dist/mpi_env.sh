# Sourced by the tests that start local MPI ranks (mpi_run_test.sh, rank_comm_test.sh):
# skips the calling test (exit 0) without mpirun; otherwise a short private directory
# (Open MPI's session directory holds Unix sockets: 108-byte limit) removed at exit, as
# TMPDIR and HOME, and Open MPI on loopback only, as root, oversubscribed.
# Sets $tmp. Usage: . "$(dirname "$0")/mpi_env.sh" PREFIX
if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP: mpirun is not installed (scripts/setup.sh installs openmpi-bin)"
    exit 0
fi
tmp=$(mktemp -d "/tmp/$1.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export TMPDIR="$tmp" HOME="$tmp"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo \
    OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_btl_base_warn_component_unused=0
