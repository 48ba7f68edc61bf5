#include "minimind/util/output_path.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "minimind/error.h"
#include "minimind/util/atomic_file.h"

namespace fs = std::filesystem;

namespace minimind {
namespace {

bool ends_in_slash(const std::string& path) {
  return path.size() > 1 && path.back() == '/';
}

}  // namespace

std::string kind_of_mode(mode_t mode) {
  if (S_ISREG(mode)) return "a file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

std::string path_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "";
  return kind_of_mode(st.st_mode);
}

std::string resolved_path(const std::string& path) {
  fs::path p = fs::weakly_canonical(fs::absolute(path));
  if (!p.has_filename() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return p.string();
}

bool is_same_or_inside(const std::string& inner, const std::string& outer) {
  const fs::path in(resolved_path(inner)), out(resolved_path(outer));
  auto i = in.begin();
  for (auto o = out.begin(); o != out.end(); ++o, ++i) {
    if (o->empty()) continue;  // a root's trailing empty element
    if (i == in.end() || *i != *o) return false;
  }
  return true;
}

void check_output_file(const std::string& path, const std::string& what) {
  if (path.empty()) throw Error(what + " is empty: give a file name");
  if (ends_in_slash(path))
    throw Error(what + " '" + path + "' ends in '/': give a file name, not a directory");
  const std::string kind = path_kind(path);
  if (kind.empty() || kind == "a file") return;
  throw Error(what + " '" + path + "' is " + kind + ", not a regular file",
              "give the path of a new or existing regular file");
}

void check_own_output_file(const std::string& path, const std::string& what,
                           const std::string& kind, bool (*ours)(std::string_view head)) {
  check_output_file(path, what);
  if (path_kind(path).empty()) return;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + what + " '" + path + "': " + std::strerror(errno));
  std::string head(4096, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  if (head.empty() || ours(head)) return;
  throw Error(what + " '" + path + "' holds something other than " + kind +
                  ", which replacing it would lose (nothing was changed)",
              "choose another " + what + ", or move that file away first");
}

void check_replaceable_directory(const std::string& path, const std::string& what,
                                 const std::vector<std::string>& inputs) {
  const std::string target = resolved_path(path);
  const std::string cwd = fs::current_path().string();
  if (is_same_or_inside(cwd, target))
    throw Error(what + " '" + path + "' is " +
                    (resolved_path(cwd) == target ? "the working directory"
                                                  : "a directory holding the working directory") +
                    ", which is never replaced",
                "give a directory that is neither the working directory nor one holding it");
  for (const std::string& input : inputs) {
    if (input.empty()) continue;
    if (is_same_or_inside(input, target))
      throw Error(what + " '" + path + "' holds '" + input + "', the input being read",
                  "write the output somewhere else");
    if (fs::is_directory(input) && is_same_or_inside(target, input))
      throw Error(what + " '" + path + "' lies inside '" + input + "', the input being read",
                  "write the output somewhere else");
  }
}

OutputReplacement::OutputReplacement(std::string path) : path_(resolved_path(path)) {
  remove_stale_temps(path_);
  temp_ = temp_path(path_);
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0) before_ = Identity{st.st_dev, st.st_ino};
}

OutputReplacement::~OutputReplacement() {
  if (committed_) return;
  std::error_code ignored;
  fs::remove_all(temp_, ignored);
}

void OutputReplacement::commit() {
  const std::string parent = fs::path(path_).parent_path().string();
  // Writers of one directory commit one at a time (the lock is held for a rename or two).
  const int dir_fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) ::flock(dir_fd, LOCK_EX);
  struct Unlock {
    int fd;
    ~Unlock() {
      if (fd >= 0) ::close(fd);  // releases the flock
    }
  } unlock{dir_fd};

  struct stat st {};
  const bool exists = ::lstat(path_.c_str(), &st) == 0;
  const bool same =
      exists ? before_ && before_->dev == st.st_dev && before_->ino == st.st_ino : !before_;
  if (!same)
    throw Error("'" + path_ + "' was written by another process while this one ran; this " +
                    "output was not kept",
                "run one writer per output at a time");
  std::string old_at = temp_;  // where the old output is once the new one is in place
  const int flags = exists ? RENAME_EXCHANGE : RENAME_NOREPLACE;
  if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, path_.c_str(), flags) != 0) {
    const int err = errno;
    if (err == EEXIST)
      throw Error("'" + path_ + "' was written by another process while this one ran; this " +
                      "output was not kept",
                  "run one writer per output at a time");
    if (err != EINVAL && err != ENOSYS)
      throw Error("cannot put '" + path_ + "' in place: " + std::strerror(err));
    // A file system without renameat2's flags: the old output is moved aside first, so
    // for a moment neither is under path (the old one is then at old_at).
    old_at = temp_path(path_);
    if (exists && std::rename(path_.c_str(), old_at.c_str()) != 0)
      throw Error("cannot move '" + path_ + "' aside: " + std::strerror(errno));
    if (std::rename(temp_.c_str(), path_.c_str()) != 0) {
      const int e = errno;
      if (exists) std::rename(old_at.c_str(), path_.c_str());
      throw Error("cannot put '" + path_ + "' in place: " + std::strerror(e));
    }
  }
  committed_ = true;
  sync_directory(parent);
  if (exists) {
    std::error_code ignored;
    fs::remove_all(old_at, ignored);
  }
}

}  // namespace minimind
