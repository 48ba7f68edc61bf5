// Where the programs read (util/input_file.h): an input is a regular file, judged on the
// opened descriptor, and the open never waits (a FIFO without a writer used to block
// minimind-train in open() for good); lines come in bounded blocks.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>

#include "minimind/error.h"
#include "minimind/util/input_file.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using namespace minimind;

TEST(InputFile, FifosDevicesAndDirectoriesAreRefusedWithoutWaiting) {
  const std::string dir = test::temp_dir("input_kinds");
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  // Opened on another thread: were the open to block, the test says so (and a writer
  // releases it) instead of hanging.
  auto opened = std::async(std::launch::async, [&] {
    return test::error_of<DataError>(
        [&] { open_input<DataError>(fifo, "corpus", "a JSONL file"); });
  });
  if (opened.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    ::close(fd);
    FAIL() << "opening a FIFO blocked";
  }
  EXPECT_EQ(opened.get(), "corpus '" + fifo +
                              "' is a FIFO, not a JSONL file\nhint: give the "
                              "path of a regular file");
  for (const auto& [path, kind] :
       std::vector<std::pair<std::string, std::string>>{{"/dev/zero", "is a character device"},
                                                        {dir, "is a directory"},
                                                        {dir + "/missing", "does not exist"},
                                                        {dir + "/missing/deeper", "does not exist"},
                                                        {"", "is an empty path"}}) {
    InputFile f;
    EXPECT_EQ(f.open(path), kind) << path;
    EXPECT_FALSE(f.is_open()) << path;
  }
  if (::geteuid() != 0) {  // root reads anything
    const std::string locked = dir + "/locked";
    std::ofstream(locked) << "x";
    fs::permissions(locked, fs::perms::none);
    InputFile f;
    EXPECT_EQ(f.open(locked), "cannot be read: Permission denied");
  }
}

TEST(InputFile, ReadsWholeAndInBlocksAfterAMove) {
  const std::string path = test::temp_dir("input_read") + "/text";
  std::string text;
  for (int i = 0; i < 300000; ++i) text += std::to_string(i) + " ";  // ~2 MB: several blocks
  std::ofstream(path, std::ios::binary) << text;
  InputFile first = open_input(path, "text");
  EXPECT_EQ(first.size(), text.size());
  InputFile f = std::move(first);
  EXPECT_FALSE(first.is_open());
  EXPECT_EQ(f.read_all(), text);
  // In small reads: each picks up where the last ended.
  InputFile again = open_input(path, "text");
  std::string pieces;
  char buf[4096];
  while (const size_t n = again.read(buf, sizeof(buf))) pieces.append(buf, n);
  EXPECT_EQ(pieces, text);
}

TEST(LineReader, CutsLongLinesAndTellsNumbersAndEnds) {
  const std::string path = test::temp_dir("line_reader") + "/lines";
  const std::string longest(3 << 20, 'x');  // 3 MiB: crosses the 1 MiB blocks
  std::ofstream(path, std::ios::binary) << "one\r\n\n" << longest << "\nlast";
  InputFile f = open_input(path, "lines");
  LineReader lines(f);
  std::string line;
  bool cut = true;
  ASSERT_TRUE(lines.next(line, 100, cut));
  EXPECT_EQ(line, "one\r");  // CRLF is the reader's caller's to handle
  EXPECT_FALSE(cut);
  EXPECT_EQ(lines.line_number(), 1);
  EXPECT_TRUE(lines.ended());
  ASSERT_TRUE(lines.next(line, 100, cut));
  EXPECT_EQ(line, "");
  ASSERT_TRUE(lines.next(line, 1 << 20, cut));
  EXPECT_TRUE(cut);
  EXPECT_EQ(line.size(), size_t{1} << 20);  // kept up to the limit, the rest skipped
  EXPECT_EQ(lines.line_number(), 3);
  ASSERT_TRUE(lines.next(line, 100, cut));
  EXPECT_EQ(line, "last");
  EXPECT_FALSE(cut);
  EXPECT_FALSE(lines.ended());  // no '\n': a file still being written
  EXPECT_EQ(lines.line_number(), 4);
  EXPECT_FALSE(lines.next(line, 100, cut));
}

// LibTorch's allocator failing is reported as out of memory, not as an unexpected error.
TEST(RunMain, AFailedAllocationIsOutOfMemory) {
  EXPECT_TRUE(is_out_of_memory(
      "[enforce fail at alloc_cpu.cpp:75] data. DefaultCPUAllocator: not enough memory: you "
      "tried to allocate 68719476704 bytes."));
  EXPECT_TRUE(
      is_out_of_memory("DefaultCPUAllocator: can't allocate memory: you tried to "
                       "allocate 8 bytes. Error code 12 (Cannot allocate memory)"));
  EXPECT_FALSE(is_out_of_memory("index 99 is out of bounds for dimension 0 with size 4"));
  EXPECT_EQ(run_main([]() -> int { throw std::bad_alloc(); }), 1);
  EXPECT_EQ(run_main([]() -> int {
              throw std::runtime_error("DefaultCPUAllocator: not enough memory: you tried");
            }),
            1);
}
