// Whole-file writes that a crash cannot leave half-done.
#pragma once

#include <string>
#include <string_view>

namespace minimind {

// Writes bytes to path + ".tmp", flushes, then renames it over path: readers see the old
// file or the new one, never a half-written one. Throws Error naming the file and the
// reason (e.g. "No space left on device"); the temporary file is then removed.
void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace minimind
