#!/bin/sh
# Prints the name of every LOOM_API function or variable declared in the given headers
# (include/loom/*.h), one a line, sorted: the symbols libloom exports. With --version-script
# it prints an ld version script instead (those names global, everything else local).
# The build links libloom with that script; tests/lib checks `nm -D` against the list.
set -eu
mode=list
if [ "${1:-}" = "--version-script" ]; then
    mode=script
    shift
fi
names=$(awk '
    # A declaration starts at a line beginning with LOOM_API and ends at its first "(" or
    # ";" (a variable): the name is the identifier just before that.
    /^LOOM_API[ \t]/ { decl = $0; collecting = 1 }
    collecting && decl != $0 { decl = decl " " $0 }
    collecting && (index(decl, "(") || index(decl, ";")) {
        p = index(decl, "(")
        if (!p) p = index(decl, ";")
        head = substr(decl, 1, p - 1)
        sub(/[ \t]+$/, "", head)
        sub(/[ \t]*\[[^]]*\]$/, "", head) # an array: name[16]
        n = split(head, w, /[^A-Za-z0-9_]+/)
        print w[n]
        collecting = 0
    }
' "$@" | LC_ALL=C sort -u)
if [ "$mode" = list ]; then
    printf '%s\n' "$names"
else
    echo "{"
    echo "  global:"
    printf '%s\n' "$names" | sed 's/.*/    &;/'
    echo "  local: *;"
    echo "};"
fi
