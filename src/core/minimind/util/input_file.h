// Where the programs read, checked as the file is opened: an input is a regular file. A FIFO
// would block the open until some writer came (forever, and a stop request cannot end a
// blocked open), a device would never end (/dev/zero) or be empty (/dev/null). Every input
// a user names (weights, corpora, tokenizers, configs) is opened through here.
#pragma once

#include <cstdint>
#include <string>

#include "minimind/error.h"

namespace minimind {

class InputFile {
 public:
  InputFile() = default;
  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  // Opens path for reading without ever blocking (O_NONBLOCK: the open of a FIFO returns at
  // once), then judges what was opened (fstat of the descriptor, so nothing can be swapped
  // in between). Returns "" when it is a regular file, else what is wrong, as words that
  // follow the path: "does not exist", "is a FIFO", "is a directory", "cannot be read: ...".
  std::string open(const std::string& path);

  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }  // for mmap; stays owned by this object
  // The whole file (a read error throws Error naming the file).
  std::string read_all();
  // Reads up to n bytes at the current position; 0 at the end (a read error throws).
  size_t read(char* buf, size_t n);

 private:
  void close();
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
};

// Lines of an input file read in 1 MiB blocks, each kept up to a limit: a line without an
// end (a file of one huge record) never grows a string past it.
class LineReader {
 public:
  explicit LineReader(InputFile& file) : file_(file), buf_(1 << 20, '\0') {}
  // The next line without its '\n', cut at `limit` bytes (`cut` tells); false at the end.
  bool next(std::string& line, size_t limit, bool& cut);
  int64_t line_number() const { return lines_; }  // of the line next() gave last
  // Whether that line ended in '\n' (a file still being written may end in half a line).
  bool ended() const { return ended_; }

 private:
  InputFile& file_;
  std::string buf_;
  size_t pos_ = 0, end_ = 0;
  int64_t lines_ = 0;
  bool ended_ = false;
};

// Opens an input file, or throws E naming it: "<what> '<path>' does not exist", "<what>
// '<path>' is a FIFO, not <noun>" (noun: "a JSONL file", "a tokenizer file", ...).
template <class E = Error>
InputFile open_input(const std::string& path, const std::string& what,
                     const std::string& noun = "a regular file", const std::string& hint = "") {
  InputFile f;
  const std::string problem = f.open(path);
  if (problem.empty()) return f;
  const bool kind = problem.rfind("is ", 0) == 0;
  throw E(what + " '" + path + "' " + problem + (kind ? ", not " + noun : std::string()),
          hint.empty() && kind ? "give the path of a regular file" : hint);
}

}  // namespace minimind
