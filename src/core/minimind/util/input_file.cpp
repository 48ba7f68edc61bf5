#include "minimind/util/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "minimind/util/output_path.h"

namespace minimind {
InputFile::InputFile(InputFile&& other) noexcept {
  *this = std::move(other);
}

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  if (this == &other) return *this;
  close();
  fd_ = std::exchange(other.fd_, -1);
  size_ = other.size_;
  path_ = std::move(other.path_);
  return *this;
}

InputFile::~InputFile() {
  close();
}

void InputFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string InputFile::open(const std::string& path) {
  close();
  path_ = path;
  if (path.empty()) return "is an empty path";
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return "does not exist";
    if (e == ENOTDIR) return "does not exist (a part of the path is not a directory)";
    // O_NONBLOCK opens of a socket fail with ENXIO.
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      return "is " + kind_of_mode(st.st_mode);
    return std::string("cannot be read: ") + std::strerror(e);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return std::string("cannot be read: ") + std::strerror(e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return "is " + kind_of_mode(st.st_mode);
  }
  // A regular file never blocks; reads go on as usual.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  fd_ = fd;
  size_ = static_cast<uint64_t>(st.st_size);
  return "";
}

size_t InputFile::read(char* buf, size_t n) {
  if (fd_ < 0) throw Error("'" + path_ + "' is not open");
  for (;;) {
    const ssize_t got = ::read(fd_, buf, n);
    if (got >= 0) return static_cast<size_t>(got);
    if (errno == EINTR) continue;
    throw Error("cannot read '" + path_ + "': " + std::strerror(errno));
  }
}

std::string InputFile::read_all() {
  std::string out;
  out.reserve(size_);
  std::string chunk(1 << 20, '\0');
  while (const size_t n = read(chunk.data(), chunk.size())) out.append(chunk.data(), n);
  return out;
}

bool LineReader::next(std::string& line, size_t limit, bool& cut) {
  line.clear();
  cut = false;
  ended_ = false;
  bool any = false;
  for (;;) {
    if (pos_ == end_) {
      end_ = file_.read(buf_.data(), buf_.size()), pos_ = 0;
      if (end_ == 0) {
        if (any) ++lines_;
        return any;
      }
    }
    any = true;
    const char* begin = buf_.data() + pos_;
    const auto* nl = static_cast<const char*>(std::memchr(begin, '\n', end_ - pos_));
    const size_t n = nl ? static_cast<size_t>(nl - begin) : end_ - pos_;
    const size_t keep = std::min(n, limit - std::min(limit, line.size()));
    cut |= keep < n;
    line.append(begin, keep);
    pos_ += n;
    if (nl) {
      ++pos_;
      ++lines_;
      ended_ = true;
      return true;
    }
  }
}

}  // namespace minimind
