// The one error type of minimind-cpp: everything a user can cause (a bad config key, a
// broken corpus line, a damaged checkpoint, a dead rank) is an Error with a message that
// names the file, key or line, and, where there is one, a hint saying what to do. The
// kinds below exist so that callers and tests can tell them apart; a main catches Error.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace minimind {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, const std::string& hint = "");
  const std::string& message() const { return message_; }
  const std::string& hint() const { return hint_; }

 private:
  std::string message_, hint_;
};

// A config key or value (the message names the key and where it was set).
class ConfigError : public Error {
  using Error::Error;
};
// A corpus, token file or run log that cannot be used (file and line).
class DataError : public Error {
  using Error::Error;
};
// A tokenizer that cannot be loaded, trained or does not fit the model.
class TokenizerError : public Error {
  using Error::Error;
};
// Weights whose names or shapes do not match the model, or an unreadable weights file.
class WeightsError : public Error {
  using Error::Error;
};
// A checkpoint that is missing, incomplete, of another version or another model.
class CheckpointError : public Error {
  using Error::Error;
};
// A run that cannot start or continue (run directory, non-finite loss).
class TrainError : public Error {
  using Error::Error;
};
// A multi-process job: torchrun variables, rendezvous, a failed or timed-out collective.
class DistError : public Error {
  using Error::Error;
};

// A stop request (Ctrl-C, SIGTERM) honoured where there is no step to finish and nothing
// to checkpoint (data preparation): the work so far is dropped, nothing half-written is
// left. run_main exits with 128 + the signal, as a shell reports a process it killed.
class Interrupted : public Error {
 public:
  Interrupted(int signal, const std::string& message) : Error(message), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

// The first line of an exception text (LibTorch's carry backtraces), at most max_chars long.
std::string first_line(const std::string& what, size_t max_chars = std::string::npos);

// Whether an exception text is LibTorch's CPU allocator failing (run_main reports it as out
// of memory, not as an unexpected error).
bool is_out_of_memory(const std::string& what);

// The body of a main: runs it and turns any exception into one error line on the default
// logger ("unexpected error: ..." for anything that is not an Error, "out of memory: ..." for
// a failed allocation) and exit status 1;
// an Interrupted is a warning and exit status 128 + its signal (130 for Ctrl-C).
int run_main(const std::function<int()>& body);

}  // namespace minimind
