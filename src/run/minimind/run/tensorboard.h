// TensorBoard's event files, written without TensorFlow: TFRecord framing (length, masked
// CRC-32C of the length, the record, masked CRC-32C of the record) around `Event` protocol
// buffers (TensorBoard's event.proto / summary.proto: wall_time 1, step 2, file_version 3,
// summary 5; Summary.value 1; Value.tag 1, simple_value 2, histo 5; HistogramProto min 1,
// max 2, num 3, sum 4, sum_squares 5, bucket_limit 6, bucket 7), encoded by hand: a few
// varints and fixed-width fields.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace minimind {

// CRC-32C (Castagnoli), and TFRecord's masking of it.
uint32_t crc32c(std::string_view bytes);
uint32_t masked_crc32c(std::string_view bytes);

class EventFileWriter {
 public:
  // A new file dir/events.out.tfevents.<seconds>.<host>.<pid> (the directory is made);
  // its first record says the file version. A resumed run gets a file of its own, and
  // TensorBoard reads them all as one run. Throws Error when the file cannot be made.
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void scalar(const std::string& tag, int64_t step, double value);
  // A histogram with one bucket per expert: the distribution of the expert index over the
  // tokens, bucket e holding counts[e].
  void expert_histogram(const std::string& tag, int64_t step, const std::vector<int64_t>& counts);
  // SessionLog START at `step` (Event field 7, status 1): a resumed run's first event, after
  // which TensorBoard drops what an earlier file logged past that step (the steps the
  // resume trains again).
  void session_start(int64_t step);
  // Writes what is buffered to the file; throws Error (a full disk) naming the file.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_event(int64_t step, const std::string& summary_value);  // one Summary.Value
  void write_record(const std::string& event);                       // TFRecord framing
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace minimind
