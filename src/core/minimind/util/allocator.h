// Which malloc the process runs on.
#pragma once

namespace minimind {

// "tcmalloc" when malloc resolves to gperftools' tcmalloc, which the programs link
// (docs/performance.md, "Memory allocator"), else "glibc malloc". The run log and
// minimind-bench print it: a build that lost the link would train slower, not wrongly.
const char* allocator_name();

}  // namespace minimind
