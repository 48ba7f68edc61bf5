// Where the programs write (util/output_path.h, util/atomic_file.h): what is refused, and
// replacement from old to new in one step, watched by a second thread.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "minimind/analysis/charts.h"
#include "minimind/error.h"
#include "minimind/util/atomic_file.h"
#include "minimind/util/output_path.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using namespace minimind;

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

// The working directory for one scope (the checks compare against it).
struct InDirectory {
  fs::path before = fs::current_path();
  explicit InDirectory(const fs::path& p) { fs::current_path(p); }
  ~InDirectory() { fs::current_path(before); }
};

}  // namespace

// A page's or a trace's name may hold a file of the user's: only the program's own kind of
// output (or an empty file) is replaced; anything else is refused and left as it was.
TEST(OutputPath, AUsersFileUnderAPagesNameIsRefusedAndKept) {
  const fs::path dir = test::temp_dir("own_output");
  auto check = [&](const fs::path& p) {
    check_own_output_file(p.string(), "--out", "a page minimind-eval writes", is_tool_page);
  };
  write(dir / "notes.html", "my notes");
  EXPECT_NE(test::error_of<Error>([&] { check(dir / "notes.html"); })
                .find("--out '" + (dir / "notes.html").string() +
                      "' holds something other than a page minimind-eval writes"),
            std::string::npos);
  EXPECT_EQ(read(dir / "notes.html"), "my notes");
  // Another tool's page, and a page of this one's look with a title it never gives.
  write(dir / "other.html", "<!DOCTYPE html>\n<html><head><title>minimind-cpp</title>");
  EXPECT_THROW(check(dir / "other.html"), Error);
  write(dir / "foreign.html", page_head("my page") + "</body></html>");
  EXPECT_THROW(check(dir / "foreign.html"), Error);
  write(dir / "page.html", page_head("minimind-cpp: 2 runs compared") + "</body></html>");
  EXPECT_NO_THROW(check(dir / "page.html"));
  write(dir / "report.html", page_head("minimind-cpp report: r", "<meta http-equiv=\"refresh\"/>"));
  EXPECT_NO_THROW(check(dir / "report.html"));
  write(dir / "empty.html", "");
  EXPECT_NO_THROW(check(dir / "empty.html"));
  EXPECT_NO_THROW(check(dir / "new.html"));
  EXPECT_THROW(check(dir), Error);  // check_output_file's refusals still hold
}

TEST(OutputPath, DevicesFifosAndDirectoriesAreNeverReplacedByAFile) {
  const fs::path dir = test::temp_dir("output_kinds");
  const fs::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  fs::create_directories(dir / "sub");
  EXPECT_NE(test::error_of<Error>([&] {
              check_output_file(fifo, "--out");
            }).find("--out '" + fifo.string() + "' is a FIFO, not a regular file"),
            std::string::npos);
  EXPECT_NE(test::error_of<Error>([&] {
              check_output_file("/dev/null", "--out");
            }).find("is a character device"),
            std::string::npos);
  EXPECT_NE(test::error_of<Error>([&] {
              check_output_file((dir / "sub").string(), "--out");
            }).find("is a directory"),
            std::string::npos);
  EXPECT_NE(test::error_of<Error>([&] {
              check_output_file((dir / "x").string() + "/", "--out");
            }).find("ends in '/'"),
            std::string::npos);
  EXPECT_NO_THROW(check_output_file((dir / "new.html").string(), "--out"));
  write(dir / "old.html", "old");
  EXPECT_NO_THROW(check_output_file((dir / "old.html").string(), "--out"));
  // write_file_atomic itself refuses: a rename would put a file where the FIFO was.
  EXPECT_NE(test::error_of<Error>([&] {
              write_file_atomic(fifo.string(), "x");
            }).find("is not a regular file; it is left as it is"),
            std::string::npos);
  struct stat st {};
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST(OutputPath, TheWorkingDirectoryItsParentsAndTheInputsAreNeverReplaced) {
  const fs::path dir = test::temp_dir("output_protected");
  fs::create_directories(dir / "run/checkpoints/step_1");
  write(dir / "run/checkpoints/step_1/model.pth", "w");
  InDirectory here(dir / "run");
  auto refusal = [](const std::string& path, std::vector<std::string> inputs = {}) {
    return test::error_of<Error>([&] { check_replaceable_directory(path, "--out", inputs); });
  };
  EXPECT_NE(refusal(".").find("is the working directory"), std::string::npos);
  EXPECT_NE(refusal("./").find("is the working directory"), std::string::npos);
  EXPECT_NE(refusal("..").find("a directory holding the working directory"), std::string::npos);
  EXPECT_NE(refusal("/").find("a directory holding the working directory"), std::string::npos);
  const std::string weights = (dir / "run/checkpoints/step_1/model.pth").string();
  const std::string checkpoint = (dir / "run/checkpoints/step_1").string();
  EXPECT_NE(refusal((dir / "run/checkpoints").string(), {weights, checkpoint})
                .find("the input being read"),
            std::string::npos);
  EXPECT_NE(refusal(checkpoint + "/hf", {weights, checkpoint}).find("lies inside"),
            std::string::npos);
  EXPECT_NO_THROW(
      check_replaceable_directory((dir / "hf").string(), "--out", {weights, checkpoint}));
  EXPECT_TRUE(is_same_or_inside("a/b/c", "a/b"));
  EXPECT_TRUE(is_same_or_inside("a/b/", "a/b"));
  EXPECT_FALSE(is_same_or_inside("a/bc", "a/b"));
  EXPECT_FALSE(is_same_or_inside("a", "a/b"));
}

// A reader that looks all the time never finds the output missing or half-written while it
// is replaced 200 times (the old export was deleted before the new one was renamed in).
TEST(OutputPath, AReplacedDirectoryIsAlwaysTheOldOrTheNewOne) {
  const fs::path dir = test::temp_dir("output_replace");
  const fs::path out = dir / "export";
  fs::create_directories(out);
  write(out / "a", "0");
  write(out / "b", "0");
  std::atomic<bool> done{false};
  std::atomic<int> looks{0}, missing{0}, mixed{0};
  std::thread reader([&] {
    while (!done) {
      const std::string a = read(out / "a"), b = read(out / "b");
      ++looks;
      if (a.empty() || b.empty()) ++missing;
      // Each version's files are written before it is put in place: b, read after a, is
      // of a's version or a later one, never an older one.
      else if (std::stoi(b) < std::stoi(a))
        ++mixed;
    }
  });
  for (int v = 1; v <= 200; ++v) {
    OutputReplacement r(out.string());
    fs::create_directories(r.temp());
    write(fs::path(r.temp()) / "a", std::to_string(v));
    write(fs::path(r.temp()) / "b", std::to_string(v));
    r.commit();
  }
  done = true;
  reader.join();
  EXPECT_EQ(missing, 0) << "of " << looks << " looks";
  EXPECT_EQ(mixed, 0) << "of " << looks << " looks";
  EXPECT_GT(looks, 200);
  EXPECT_EQ(read(out / "a"), "200");
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_EQ(e.path(), out) << "left behind";
}

TEST(OutputPath, OfTwoWritersTheFirstToFinishWinsAndTheOtherSaysWhy) {
  const fs::path dir = test::temp_dir("output_race");
  const fs::path out = dir / "model.gguf";
  write(out, "old");
  OutputReplacement first(out.string()), second(out.string());
  write(first.temp(), "first");
  write(second.temp(), "second");
  first.commit();
  EXPECT_NE(test::error_of<Error>([&] {
              second.commit();
            }).find("was written by another process while this one ran"),
            std::string::npos);
  EXPECT_EQ(read(out), "first");
  // The same when the output did not exist at the start.
  const fs::path fresh = dir / "fresh";
  OutputReplacement a(fresh.string()), b(fresh.string());
  write(a.temp(), "a");
  write(b.temp(), "b");
  a.commit();
  EXPECT_THROW(b.commit(), Error);
  EXPECT_EQ(read(fresh), "a");
}

TEST(OutputPath, TemporariesOfWritersThatDiedAreRemoved) {
  const fs::path dir = test::temp_dir("output_stale");
  const fs::path out = dir / "hf";
  // The PID of a process that has ended: a child that exits at once.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  const fs::path dead = dir / ("hf.tmp." + std::to_string(child) + ".0");
  const fs::path alive = dir / ("hf.tmp." + std::to_string(::getpid()) + ".99");
  fs::create_directories(dead / "sub");
  write(dead / "sub/model.safetensors", "half");
  fs::create_directories(alive);
  { OutputReplacement r(out.string()); }  // not committed: its own temporary goes too
  EXPECT_FALSE(fs::exists(dead)) << "a dead writer's temporary directory stayed";
  EXPECT_TRUE(fs::exists(alive)) << "a live writer's temporary was removed";
  EXPECT_FALSE(fs::exists(out));
}
