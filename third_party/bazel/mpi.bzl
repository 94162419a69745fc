# loom_mpi_repository: a repository rule that finds Open MPI (Debian's libopenmpi-dev) on the
# build machine, and yields an empty-but-valid repository where it is absent, so the build
# still succeeds (dist/ then builds its no-MPI variant, whose init says MPI is missing).
#
# The generated repository @loom_mpi holds:
#   defs.bzl  MPI_AVAILABLE (bool), MPI_REASON (why MPI is off, "" if on), MPIRUN (absolute
#             path of mpirun, "" if absent)
#   BUILD     :mpi (mpi.h's include directory and -lmpi; empty without MPI)
#
# Environment (re-read when it changes):
#   MPI_INCLUDE   the directory holding mpi.h (default: Debian's Open MPI paths)
#   MPI_LIBDIR    the directory holding libmpi.so (default: the multiarch lib dirs)
#   LOOM_NO_MPI=1 pretend MPI is absent (tests the no-MPI build)

_INCLUDES = [
    "/usr/lib/x86_64-linux-gnu/openmpi/include",
    "/usr/lib/aarch64-linux-gnu/openmpi/include",
    "/usr/include/openmpi",
    "/usr/include",
]

_LIBDIRS = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
]

def _loom_mpi_impl(rctx):
    env = rctx.os.environ
    reason = ""
    inc = ""
    libdir = ""
    if env.get("LOOM_NO_MPI", "") not in ["", "0"]:
        reason = "LOOM_NO_MPI is set"
    if not reason:
        cands = [env["MPI_INCLUDE"]] if env.get("MPI_INCLUDE", "") else _INCLUDES
        for d in cands:
            if rctx.path(d + "/mpi.h").exists:
                inc = d
                break
        if not inc:
            reason = "mpi.h not found (install libopenmpi-dev)"
    if not reason:
        cands = [env["MPI_LIBDIR"]] if env.get("MPI_LIBDIR", "") else _LIBDIRS
        for d in cands:
            if rctx.path(d + "/libmpi.so").exists:
                libdir = d
                break
        if not libdir:
            reason = "libmpi.so not found (install libopenmpi-dev)"
    mpirun = rctx.which("mpirun")
    ok = reason == ""
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)
    rctx.file("defs.bzl", "MPI_AVAILABLE = %s\nMPI_REASON = %r\nMPIRUN = %r\n" % (
        "True" if ok else "False",
        reason,
        str(mpirun) if mpirun else "",
    ))
    if ok:
        # the headers are outside the repository: link them in as include/
        rctx.symlink(inc + "/mpi.h", "include/mpi.h")
        for h in ["mpi_portable_platform.h", "mpi-ext.h"]:
            if rctx.path(inc + "/" + h).exists:
                rctx.symlink(inc + "/" + h, "include/" + h)
        rctx.file("BUILD", """cc_library(
    name = "mpi",
    hdrs = glob(["include/*.h"]),
    includes = ["include"],
    linkopts = ["-L%s", "-lmpi"],
    visibility = ["//visibility:public"],
)
""" % libdir)
    else:
        rctx.file("BUILD", 'cc_library(name = "mpi", visibility = ["//visibility:public"])\n')

loom_mpi_repository = repository_rule(
    implementation = _loom_mpi_impl,
    environ = ["MPI_INCLUDE", "MPI_LIBDIR", "LOOM_NO_MPI"],
    local = True,
)
