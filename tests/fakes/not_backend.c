/* A valid shared library that is not an hp backend: it has no hp_backend_entry_v1 symbol. */
__attribute__((visibility("default"))) int hp_not_a_backend(void) { return 0; }
