#include "minimind/util/allocator.h"

#include <dlfcn.h>

#include <string>

namespace minimind {

const char* allocator_name() {
  // The library that the process's malloc symbol resolves to (an LD_PRELOAD wins over the
  // link), by its file name.
  static const std::string name = [] {
    Dl_info info{};
    void* const used = dlsym(RTLD_DEFAULT, "malloc");
    if (used == nullptr || dladdr(used, &info) == 0 || info.dli_fname == nullptr)
      return std::string("unknown malloc");
    const std::string path = info.dli_fname;
    const std::string file = path.substr(path.find_last_of('/') + 1);  // npos + 1 = 0
    if (file.find("tcmalloc") != std::string::npos) return std::string("tcmalloc");
    if (file.rfind("libc.so", 0) == 0) return std::string("glibc malloc");
    return file;  // e.g. libjemalloc.so.2
  }();
  return name.c_str();
}

}  // namespace minimind
