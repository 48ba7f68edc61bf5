#include "minimind/run/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "minimind/error.h"

namespace minimind {
namespace {

// Protocol buffer wire format: a key is (field << 3 | wire type).
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire) {
  varint(out, static_cast<uint64_t>(field << 3 | wire));
}
template <class T>
void raw(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian, as protobuf's fixed fields
  out.append(b, sizeof(T));
}
void f64(std::string& out, int field, double v) {
  key(out, field, 1), raw(out, v);
}
void f32(std::string& out, int field, float v) {
  key(out, field, 5), raw(out, v);
}
void bytes(std::string& out, int field, std::string_view v) {
  key(out, field, 2), varint(out, v.size()), out.append(v.data(), v.size());
}
void packed_doubles(std::string& out, int field, const std::vector<double>& v) {
  std::string body;
  for (double x : v) raw(body, x);
  bytes(out, field, body);
}

double wall_time() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0x82F63B78u ^ (c >> 1) : c >> 1;  // reflected
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(wall_time())) + "." +
          host + "." + std::to_string(::getpid());
  // A second writer in the same second of the same process (a resume in a test) gets a
  // name of its own.
  const std::string base = path_;
  for (int n = 1; std::filesystem::exists(path_); ++n) path_ = base + "." + std::to_string(n);
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_)
    throw Error("cannot create the TensorBoard event file " + path_ + ": " + std::strerror(errno));
  std::string event;
  f64(event, 1, wall_time());
  bytes(event, 3, "brain.Event:2");  // file_version
  write_record(event);
  flush();
}

EventFileWriter::~EventFileWriter() {
  if (file_) std::fclose(file_);
}

void EventFileWriter::write_event(int64_t step, const std::string& summary_value) {
  std::string summary;
  bytes(summary, 1, summary_value);  // Summary.value
  std::string event;
  f64(event, 1, wall_time());
  key(event, 2, 0), varint(event, static_cast<uint64_t>(step));
  bytes(event, 5, summary);
  write_record(event);
}

void EventFileWriter::write_record(const std::string& event) {
  std::string length;
  raw<uint64_t>(length, event.size());
  std::string framed = length;
  raw<uint32_t>(framed, masked_crc32c(length));
  framed += event;
  raw<uint32_t>(framed, masked_crc32c(event));
  std::fwrite(framed.data(), 1, framed.size(), file_);
}

void EventFileWriter::session_start(int64_t step) {
  std::string session;
  key(session, 1, 0), varint(session, 1);  // status: START
  std::string event;
  f64(event, 1, wall_time());
  key(event, 2, 0), varint(event, static_cast<uint64_t>(step));
  bytes(event, 7, session);
  write_record(event);
}

void EventFileWriter::scalar(const std::string& tag, int64_t step, double value) {
  std::string v;
  bytes(v, 1, tag);
  f32(v, 2, static_cast<float>(value));  // simple_value
  write_event(step, v);
}

void EventFileWriter::expert_histogram(const std::string& tag, int64_t step,
                                       const std::vector<int64_t>& counts) {
  double num = 0, sum = 0, sum_sq = 0;
  std::vector<double> limits, buckets;
  for (size_t e = 0; e < counts.size(); ++e) {
    const double c = static_cast<double>(counts[e]), x = static_cast<double>(e);
    num += c, sum += c * x, sum_sq += c * x * x;
    limits.push_back(x + 0.5);  // bucket e holds the values up to e + 0.5
    buckets.push_back(c);
  }
  std::string h;
  f64(h, 1, 0.0);
  f64(h, 2, counts.empty() ? 0.0 : static_cast<double>(counts.size() - 1));
  f64(h, 3, num), f64(h, 4, sum), f64(h, 5, sum_sq);
  packed_doubles(h, 6, limits);
  packed_doubles(h, 7, buckets);
  std::string v;
  bytes(v, 1, tag);
  bytes(v, 5, h);  // histo
  write_event(step, v);
}

void EventFileWriter::flush() {
  if (std::fflush(file_) != 0 || std::ferror(file_)) {
    const std::string reason = std::strerror(errno);
    std::clearerr(file_);
    throw Error("cannot write the TensorBoard event file " + path_ + ": " + reason);
  }
}

}  // namespace minimind
