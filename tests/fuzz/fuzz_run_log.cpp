// The run-log reader behind --inspect and --report, and both views: the input is split at
// 0x01 bytes into metrics.jsonl, expert_load.jsonl and events.jsonl of a run directory.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_support.h"
#include "minimind/analysis/inspect.h"
#include "minimind/analysis/report.h"
#include "minimind/error.h"
#include "minimind/run/run_log.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  minimind::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir =
      std::string(tmp ? tmp : "/tmp") + "/minimind-fuzz-run-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string text(reinterpret_cast<const char*>(data), size);
  const char* files[] = {"metrics.jsonl", "expert_load.jsonl", "events.jsonl"};
  size_t start = 0;
  for (const char* f : files) {
    const size_t end = std::min(text.find('\x01', start), text.size());
    std::ofstream(dir + "/" + f, std::ios::binary | std::ios::trunc)
        << text.substr(std::min(start, text.size()), end - std::min(start, text.size()));
    start = end + 1;
  }
  try {
    const minimind::RunLogs logs = minimind::read_run_logs(dir);
    minimind::inspect_text(logs);
    minimind::render_report(logs);
  } catch (const minimind::DataError&) {
  }
  return 0;
}
