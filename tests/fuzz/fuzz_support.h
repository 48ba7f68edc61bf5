// Shared by the libFuzzer targets: a scratch file per process, and quiet logs.
#pragma once

#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace minimind::fuzz {

// Writes the input to a file of this process under $TMPDIR (the readers take paths).
inline std::string scratch_file(const uint8_t* data, size_t size, const char* name = "input") {
  const char* tmp = std::getenv("TMPDIR");
  const std::string path =
      std::string(tmp ? tmp : "/tmp") + "/minimind-fuzz-" + std::to_string(::getpid()) + "-" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

// Warnings about bad lines are expected by the thousand: send them nowhere.
inline void quiet_logs() {
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("fuzz", std::make_shared<spdlog::sinks::null_sink_mt>()));
}

}  // namespace minimind::fuzz
