// Whole-file writes that a crash cannot leave half-done.
#pragma once

#include <string>
#include <string_view>

namespace minimind {

// A temporary name next to path that no other writer uses: path + ".tmp.<pid>.<n>". Two
// processes (or two writers in one) preparing the same file each write their own and
// rename it over path; the last rename wins and every reader sees a whole file.
std::string temp_path(const std::string& path);

// Removes temporaries of path left by writers that no longer run (a kill -9 or a power cut
// mid-write): path.tmp.<pid>.* whose process is gone, files or directories (an export's).
// Temporaries of live processes stay.
void remove_stale_temps(const std::string& path);

// Writes bytes to temp_path(path), flushes, then renames it over path: readers see the old
// file or the new one, never a half-written one. Throws Error naming the file and the
// reason (e.g. "No space left on device"); the temporary file is then removed. A path that
// exists and is not a regular file (a directory, device, FIFO, socket) is refused.
void write_file_atomic(const std::string& path, std::string_view bytes);

// Flushes a directory's entries to disk (after a rename in it, or before one that exposes
// it), so that a power cut cannot undo the rename or expose missing entries. Best effort.
void sync_directory(const std::string& dir);

}  // namespace minimind
