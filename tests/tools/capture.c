#define _POSIX_C_SOURCE 200809L /* fileno, dup */
#include "tests/tools/capture.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The whole of f (from its start) into a new string. */
static char *slurp(FILE *f) {
    long n = ftell(f);
    rewind(f);
    char *s = calloc(n > 0 ? (size_t)n + 1 : 1, 1);
    if (s && n > 0 && fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = 0;
    return s;
}

int loom_test_capture(loom_test_cmd_fn fn, char **argv, char **out, char **err) {
    int argc = 0;
    while (argv[argc])
        argc++;
    fflush(stdout);
    fflush(stderr);
    FILE *fo = tmpfile(), *fe = tmpfile();
    int so = dup(1), se = dup(2);
    dup2(fileno(fo), 1);
    dup2(fileno(fe), 2);
    int rc = fn(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    *out = slurp(fo);
    if (err)
        *err = slurp(fe);
    fclose(fo);
    fclose(fe);
    return rc;
}
