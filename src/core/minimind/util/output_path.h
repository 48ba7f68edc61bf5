// Where the programs write, checked before anything is written or deleted: an output is a
// regular file or a directory the tool made, never a device, the working directory, or
// the input being read; a replaced output goes from old to new in one step.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace minimind {

// What is at path (following symlinks): "" when nothing, else "a file", "a directory",
// "a character device", "a block device", "a FIFO", "a socket".
std::string path_kind(const std::string& path);
// The same words for a stat() mode.
std::string kind_of_mode(mode_t mode);

// path as an absolute, normalised path without a trailing slash, with symlinks of the
// part that exists resolved (fs::weakly_canonical): the form the checks below compare.
std::string resolved_path(const std::string& path);

// True when `inner` is `outer` or lies inside it (both resolved first).
bool is_same_or_inside(const std::string& inner, const std::string& outer);

// An output file the program creates or replaces (`what` names it in messages, e.g.
// "--out"). Refused with an Error saying what is there: a directory, a path ending in '/',
// a device, FIFO or socket.
void check_output_file(const std::string& path, const std::string& what);

// An output file the program replaces only when what is there is its own kind of output
// (`ours` judges the file's first bytes), or empty: a page, a trace. A user's file under
// that name would be lost, so it is refused with an Error naming `kind` (e.g. "a page
// minimind-eval writes"). check_output_file's refusals come first.
void check_own_output_file(const std::string& path, const std::string& what,
                           const std::string& kind, bool (*ours)(std::string_view head));

// A directory the program may delete or replace: never the working directory or a
// directory holding it, never a directory holding one of `inputs` or inside one of them.
// Error naming what it is otherwise.
void check_replaceable_directory(const std::string& path, const std::string& what,
                                 const std::vector<std::string>& inputs);

// Writing an output (a file or a directory) under a temporary name beside it and putting
// it in place when complete. The old output stays whole until the new one is: a kill at
// any point leaves the old or the new under `path`, and at most a temporary that the next
// writer to `path` removes. Two writers to one path: the first to finish wins, the other's
// commit() throws (the output changed while it was being written) and removes its work.
class OutputReplacement {
 public:
  // Takes note of what is at `path` now; removes temporaries of writers that no longer run.
  explicit OutputReplacement(std::string path);
  ~OutputReplacement();  // removes the temporary if commit() did not happen
  OutputReplacement(const OutputReplacement&) = delete;
  OutputReplacement& operator=(const OutputReplacement&) = delete;

  const std::string& temp() const { return temp_; }  // where to write
  // Puts temp() at path; the old output (if any) is removed after the new one is in place.
  void commit();

 private:
  struct Identity {
    dev_t dev;
    ino_t ino;
  };
  std::string path_, temp_;
  std::optional<Identity> before_;
  bool committed_ = false;
};

}  // namespace minimind
