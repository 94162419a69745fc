/*
 * What the registry tells libloom's other files (backends/module-api.c) about how libloom
 * was linked: a program linking libloom.a has the core and the CPU backend in its own
 * executable, and no module backend unless LOOM_BACKEND_PATH names the installed lib/loom/
 * (libloom.a does not know where it was installed).
 */
#ifndef LOOM_BACKENDS_REGISTRY_INTERNAL_H
#define LOOM_BACKENDS_REGISTRY_INTERNAL_H

#include <stdbool.h>

/* True when the registry's code lies in the executable itself (libloom.a, or a program that
 * links the library statically); false in libloom.so or a shared test library. */
bool loom__registry_linked_statically(void);

/* " in this program: it links libloom statically ... (how to get libloom-<module>.so)" when
 * linked statically, else "" (thread-local storage, valid until the next call on the
 * thread). */
const char *loom__registry_static_hint(const char *module);

#endif
