/* A shared object that is not a loom backend: it lacks the loom_backend_init entry point.
 * registry_test checks that loading it fails with a message naming the path. */
__attribute__((visibility("default"))) int loom_test_not_an_entry_point(void) {
    return 42;
}
