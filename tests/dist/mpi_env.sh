# Sourced by the tests that start local MPI ranks (mpi_run_test.sh, rank_comm_test.sh):
# skips the calling test (exit 0) without mpirun; otherwise a short private directory
# (Open MPI's session directory holds Unix sockets: 108-byte limit) removed at exit, as
# TMPDIR and HOME, and Open MPI on loopback only, as root, oversubscribed.
# Sets $tmp, and $model: the shared stories260K.gguf (LOOM_MODELS_DIR, else ../shared/models
# beside the workspace), which the caller checks exists. Usage: . "$(dirname "$0")/mpi_env.sh" PREFIX
models="${LOOM_MODELS_DIR:-}"
if [ -z "$models" ]; then
    ws=$(readlink -f "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-loom}/WORKSPACE" 2>/dev/null || true)
    [ -n "$ws" ] && models="$(dirname "$ws")/../shared/models"
fi
model="$models/stories260K.gguf"
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
