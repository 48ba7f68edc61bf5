#include "minimind/util/allocator.h"

#include <dlfcn.h>

namespace minimind {

const char* allocator_name() {
  // gperftools exports its entry points as tc_*, and malloc is an alias of tc_malloc when
  // tcmalloc is the process's malloc (not merely loaded by some library).
  void* const tc = dlsym(RTLD_DEFAULT, "tc_malloc");
  void* const used = dlsym(RTLD_DEFAULT, "malloc");
  return tc != nullptr && tc == used ? "tcmalloc" : "glibc malloc";
}

}  // namespace minimind
