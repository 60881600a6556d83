/* Stands in for a vendor runtime (libcudart, libascendcl) that a badly built plugin links directly.
   The test removes it from the loader's reach, so dlopen of that plugin fails on the dependency. */
__attribute__((visibility("default"))) int hpfakevendor_answer(void) { return 42; }
