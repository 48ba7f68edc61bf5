// Which malloc the process runs on.
#pragma once

namespace minimind {

// "tcmalloc" when malloc resolves to gperftools' tcmalloc, which the programs link
// (docs/performance.md, "Memory allocator"); "glibc malloc" for glibc's; otherwise the file
// name of the library that provides malloc (a user's LD_PRELOAD). minimind-bench prints it
// and minimind-train warns when it is not tcmalloc: such a process trains slower, not wrongly.
const char* allocator_name();

}  // namespace minimind
