// Data: JSONL reading and bad input, the sentencepiece tokenizer (round trip, determinism,
// Python parity), token files (format errors), preparation cache, and batching.
#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "minimind/config.h"
#include "minimind/data/batcher.h"
#include "minimind/data/jsonl.h"
#include "minimind/data/prepare.h"
#include "minimind/data/token_file.h"
#include "minimind/data/tokenizer.h"
#include "support/test_support.h"

using namespace minimind;
namespace fs = std::filesystem;

namespace {

using test::temp_dir;
using test::write_text;

std::string jsonl_line(const std::string& text) {
  return nlohmann::json{{"text", text}}.dump() + "\n";
}

// The first n records of the shipped corpus, plus some Chinese and emoji text.
std::string sample_corpus(int n) {
  std::ifstream in(test::source_path("data/austen.jsonl"));
  std::string out, line;
  for (int i = 0; i < n && std::getline(in, line); ++i) out += line + "\n";
  for (int i = 0; i < 20; ++i) {
    out += jsonl_line("她说：“今天天气很好，我们去公园散步吧。”他笑了。第" + std::to_string(i) +
                      "章\n新的一天。");
    out += jsonl_line("Emoji line 🙂🚀 with tabs\tand  double  spaces " + std::to_string(i));
  }
  return out;
}

std::vector<std::string> texts_of(const std::string& path) {
  std::vector<std::string> texts;
  read_corpus(path, {}, [&](std::string_view t, int64_t) { texts.emplace_back(t); });
  return texts;
}

// A DataConfig over `corpus`, written to dir/name, with its cache in dir/cache.
DataConfig corpus_config(const std::string& dir, const std::string& name,
                         const std::string& corpus) {
  write_text(dir + "/" + name, corpus);
  DataConfig d;
  d.train = dir + "/" + name;
  d.cache_dir = dir + "/cache";
  return d;
}

// One tokenizer for the suite (training takes ~0.5 s).
class TokenizerTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(temp_dir("tok"));
    write_text(*dir_ + "/corpus.jsonl", sample_corpus(300));
    texts_ = new std::vector<std::string>(texts_of(*dir_ + "/corpus.jsonl"));
    std::vector<std::string_view> views(texts_->begin(), texts_->end());
    bytes_ = new std::string(Tokenizer::train(views, 1000));
    write_text(*dir_ + "/tok.model", *bytes_);
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete texts_;
    delete bytes_;
  }
  static std::string* dir_;
  static std::vector<std::string>* texts_;
  static std::string* bytes_;
};
std::string* TokenizerTest::dir_ = nullptr;
std::vector<std::string>* TokenizerTest::texts_ = nullptr;
std::string* TokenizerTest::bytes_ = nullptr;

const std::vector<std::string> kRoundTripTexts = {
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
    "Line one\nLine two\n\nafter a blank line\n",
    "  leading and trailing spaces  ",
    "multiple   spaces\tand\ttabs",
    "中文文本：你好，世界！机器学习。",
    "emoji 🙂🚀👩‍👩‍👧 and ünïcödé",
    "mixed: Emma 爱 🙂\r\nwindows newline",
    "\n",
    "x",
};

}  // namespace

TEST(Jsonl, ValidUtf8Check) {
  EXPECT_TRUE(is_valid_utf8("plain ascii"));
  EXPECT_TRUE(is_valid_utf8("中文 🙂"));
  EXPECT_FALSE(is_valid_utf8("\xff"));
  EXPECT_FALSE(is_valid_utf8("abc\xe4\xb8"));       // truncated
  EXPECT_FALSE(is_valid_utf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));      // UTF-16 surrogate
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // > U+10FFFF
}

TEST(Jsonl, BadLinesAreSkippedAndCounted) {
  const std::string dir = temp_dir("bad");
  const std::string path = dir + "/bad.jsonl";
  write_text(path, jsonl_line("good one") +                 // 1
                       "{\"text\": \"unterminated\n" +      // 2 invalid JSON
                       "{\"txt\": \"wrong key\"}\n" +       // 3 no text
                       "{\"text\": 42}\n" +                 // 4 text not a string
                       "[\"text\"]\n" +                     // 5 not an object
                       "{\"text\": \"\"}\n" +               // 6 empty text
                       "\n" +                               // 7 blank line
                       "{\"text\": \"bad \xff byte\"}\n" +  // 8 invalid UTF-8
                       jsonl_line("good two"));             // 9
  std::vector<std::pair<std::string, int64_t>> got;
  CorpusStats stats = read_corpus(
      path, {}, [&](std::string_view t, int64_t line) { got.emplace_back(std::string(t), line); });
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], std::make_pair(std::string("good one"), int64_t{1}));
  EXPECT_EQ(got[1], std::make_pair(std::string("good two"), int64_t{9}));
  EXPECT_EQ(stats.lines, 9);
  EXPECT_EQ(stats.skipped, 7);
  EXPECT_EQ(stats.skipped_by_reason["invalid JSON"], 1);
  EXPECT_EQ(stats.skipped_by_reason["no string \"text\" field"], 3);
  EXPECT_EQ(stats.skipped_by_reason["empty text"], 1);
  EXPECT_EQ(stats.skipped_by_reason["blank line"], 1);
  EXPECT_EQ(stats.skipped_by_reason["invalid UTF-8"], 1);
  EXPECT_NE(stats.summary(path).find("7 skipped"), std::string::npos);
}

TEST(Jsonl, StrictModeNamesFileAndLine) {
  const std::string path = temp_dir("strict") + "/c.jsonl";
  write_text(path, jsonl_line("ok") + jsonl_line("ok") + "{broken\n");
  try {
    read_corpus(path, {true, 20}, [](std::string_view, int64_t) {});
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":3: invalid JSON"), std::string::npos) << e.what();
  }
}

TEST(Jsonl, MissingAndEmptyCorporaAreErrors) {
  const std::string dir = temp_dir("empty");
  EXPECT_THROW(read_corpus(dir + "/nope.jsonl", {}, [](std::string_view, int64_t) {}), DataError);
  write_text(dir + "/empty.jsonl", "");
  try {
    read_corpus(dir + "/empty.jsonl", {}, [](std::string_view, int64_t) {});
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("no usable records"), std::string::npos);
  }
}

// A device never ends (/dev/zero) and a FIFO blocks: both refused before a byte is read.
// A line longer than kMaxRecordBytes is skipped as a bad record without being held whole,
// and the records around it are read as usual; a line of exactly the limit is kept.
TEST(Jsonl, SpecialFilesAreRefusedAndHugeRecordsSkipped) {
  const std::string dir = temp_dir("special");
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0644), 0);
  for (const std::string& path : {std::string("/dev/zero"), dir + "/fifo", dir}) {
    const std::string msg =
        test::error_of<DataError>([&] { read_corpus(path, {}, [](std::string_view, int64_t) {}); });
    EXPECT_NE(msg.find("corpus '" + path + "' is "), std::string::npos) << msg;
    EXPECT_NE(msg.find(", not a JSONL file"), std::string::npos) << msg;
  }
  EXPECT_NE(test::error_of<TokenizerError>([&] {
              Tokenizer::from_file(dir + "/fifo");
            }).find("'" + dir + "/fifo' is a FIFO, not a tokenizer file"),
            std::string::npos);
  // {"text": "aaa..."} of exactly kMaxRecordBytes bytes, and one byte longer.
  const std::string frame = jsonl_line("");  // {"text": ""}\n
  const size_t fill = kMaxRecordBytes - (frame.size() - 1);
  const std::string path = dir + "/huge.jsonl";
  write_text(path, jsonl_line("first") + jsonl_line(std::string(fill + 1, 'a')) +
                       jsonl_line(std::string(fill, 'b')) + jsonl_line("last"));
  std::vector<std::pair<size_t, int64_t>> got;  // (text length, line)
  CorpusStats stats = read_corpus(
      path, {}, [&](std::string_view t, int64_t line) { got.emplace_back(t.size(), line); });
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], std::make_pair(size_t{5}, int64_t{1}));
  EXPECT_EQ(got[1], std::make_pair(fill, int64_t{3}));
  EXPECT_EQ(got[2], std::make_pair(size_t{4}, int64_t{4}));
  EXPECT_EQ(stats.skipped_by_reason["record over 16 MiB"], 1);
  EXPECT_THROW(read_corpus(path, {true, 20}, [](std::string_view, int64_t) {}), DataError);
}

TEST_F(TokenizerTest, SpecialIdsAreMiniMinds) {
  Tokenizer tok = Tokenizer::from_bytes(*bytes_, "test");
  EXPECT_EQ(tok.vocab_size(), 1000);
  EXPECT_EQ(tok.specials(), SpecialIds{});
  EXPECT_EQ(tok.piece(tok.specials().pad), "<|endoftext|>");
  EXPECT_EQ(tok.piece(tok.specials().bos), "<|im_start|>");
  EXPECT_EQ(tok.piece(tok.specials().eos), "<|im_end|>");
}

TEST_F(TokenizerTest, RoundTripIsLossless) {
  Tokenizer tok = Tokenizer::from_file(*dir_ + "/tok.model");
  for (const auto& text : kRoundTripTexts) EXPECT_EQ(tok.decode(tok.encode(text)), text) << text;
  for (size_t i = 0; i < texts_->size(); i += 7)
    EXPECT_EQ(tok.decode(tok.encode((*texts_)[i])), (*texts_)[i]);
}

TEST_F(TokenizerTest, NewlineIsItsOwnPiece) {
  Tokenizer tok = Tokenizer::from_bytes(*bytes_, "test");
  std::vector<int32_t> nl = tok.encode("\n");
  ASSERT_EQ(nl.size(), 1u);
  EXPECT_EQ(tok.piece(nl[0]), "\n");
  std::vector<int32_t> ids = tok.encode("Emma.\nHarriet.");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), nl[0]), 1);
}

TEST_F(TokenizerTest, TrainingIsDeterministic) {
  std::vector<std::string_view> views(texts_->begin(), texts_->end());
  EXPECT_EQ(Tokenizer::train(views, 1000), *bytes_);
}

TEST_F(TokenizerTest, PythonSentencepieceReproducesIds) {
  Tokenizer tok = Tokenizer::from_bytes(*bytes_, "test");
  nlohmann::json cases = nlohmann::json::array();
  std::vector<std::string> texts = kRoundTripTexts;
  for (size_t i = 0; i < texts_->size(); i += 3) texts.push_back((*texts_)[i]);
  for (const auto& t : texts) cases.push_back({{"text", t}, {"ids", tok.encode(t)}});
  write_text(*dir_ + "/cases.json", cases.dump());
  const std::string cmd = std::string(MINIMIND_PYTHON) + " " +
                          test::source_path("tests/reference/check_tokenizer.py") + " " + *dir_ +
                          "/tok.model " + *dir_ + "/cases.json";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST(Tokenizer, BadModelFileIsAnError) {
  const std::string dir = temp_dir("badtok");
  write_text(dir + "/bad.model", "not a model");
  EXPECT_THROW(Tokenizer::from_file(dir + "/bad.model"), TokenizerError);
  EXPECT_THROW(Tokenizer::from_file(dir + "/missing.model"), TokenizerError);
}

// ---- Token files

namespace {
std::string make_token_file(const std::string& path, const std::vector<std::vector<int32_t>>& docs,
                            uint32_t vocab = 100) {
  TokenFileWriter w(path, vocab, {1, 2});
  for (const auto& d : docs) w.add_document(d);
  w.finish();
  return path;
}

void corrupt(const std::string& path, size_t offset, const std::string& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string open_error(const std::string& path) {
  try {
    TokenFile::open(path);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(TokenFileFormat, WriteAndReadBack) {
  const std::string path = make_token_file(temp_dir("tf") + "/a.tok", {{1, 5, 6, 2}, {1, 99, 2}});
  TokenFile f = TokenFile::open(path);
  EXPECT_EQ(f.num_tokens(), 7u);
  EXPECT_EQ(f.num_docs(), 2u);
  EXPECT_EQ(f.vocab_size(), 100u);
  EXPECT_EQ(f.doc_start(1), 4u);
  EXPECT_EQ(f.doc_length(1), 3u);
  EXPECT_EQ(f.token(5), 99);
  EXPECT_EQ(f.source_key(), (SourceKey{1, 2}));
  EXPECT_EQ(fs::file_size(path), 64u + 16u + 3 * 8u);  // header, 7 uint16 + pad, 3 offsets
}

TEST(TokenFileFormat, CorruptedFilesAreClearErrors) {
  const std::string dir = temp_dir("tfbad");
  const std::vector<std::vector<int32_t>> docs = {{1, 5, 6, 2}, {1, 7, 2}};
  EXPECT_NE(open_error(dir + "/missing.tok").find("missing.tok' does not exist"),
            std::string::npos);

  corrupt(make_token_file(dir + "/magic.tok", docs), 0, "XXXX");
  EXPECT_NE(open_error(dir + "/magic.tok").find("bad magic"), std::string::npos);

  corrupt(make_token_file(dir + "/version.tok", docs), 8, std::string("\x07\0\0\0", 4));
  EXPECT_NE(open_error(dir + "/version.tok").find("format version 7"), std::string::npos);

  make_token_file(dir + "/trunc.tok", docs);
  fs::resize_file(dir + "/trunc.tok", fs::file_size(dir + "/trunc.tok") - 8);
  EXPECT_NE(open_error(dir + "/trunc.tok").find("truncated"), std::string::npos);

  corrupt(make_token_file(dir + "/token.tok", docs), 64 + 2, std::string("\xff\x00", 2));
  EXPECT_NE(open_error(dir + "/token.tok").find(">= vocab size"), std::string::npos);

  // A document start near 2^64 wraps "start + 2 <= next" around: found by fuzz_token_file.
  corrupt(make_token_file(dir + "/wrap.tok", docs), 64 + 16 + 8,
          std::string("\xfe\xff\xff\xff\xff\xff\xff\xff", 8));
  EXPECT_NE(open_error(dir + "/wrap.tok").find("corrupted document table"), std::string::npos);

  write_text(dir + "/short.tok", "MMTOK");
  EXPECT_NE(open_error(dir + "/short.tok").find("truncated"), std::string::npos);
  // Every message tells the user what to do.
  EXPECT_NE(open_error(dir + "/magic.tok").find("re-prepare"), std::string::npos);
}

TEST(TokenFileFormat, UnfinishedWriterLeavesNothing) {
  const std::string dir = temp_dir("tfabort");
  {
    TokenFileWriter w(dir + "/x.tok", 100, {0, 0});
    w.add_document({1, 2});
  }  // destroyed without finish(), as when tokenisation throws
  EXPECT_FALSE(fs::exists(dir + "/x.tok"));
  EXPECT_TRUE(fs::is_empty(dir)) << "a temporary file was left behind";
}

// A writer killed mid-write (kill -9) leaves its temporary; the next writer of that file
// removes it, and leaves a live process's temporary alone.
TEST(TokenFileFormat, StaleTemporariesOfDeadWritersAreRemoved) {
  const std::string dir = temp_dir("tfstale");
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  waitpid(dead, nullptr, 0);  // reaped: its pid names no process now
  const std::string stale = dir + "/x.tok.tmp." + std::to_string(dead) + ".0";
  const std::string live = dir + "/x.tok.tmp." + std::to_string(getpid()) + ".99";
  std::ofstream(stale) << "half";
  std::ofstream(live) << "half";
  TokenFileWriter w(dir + "/x.tok", 100, {0, 0});
  w.add_document({1, 2});
  w.finish();
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(TokenFile::open(dir + "/x.tok").num_tokens(), 2u);
}

// Two writers of one file at once (two processes preparing one cache): each writes its own
// temporary and renames it over the file, so both finish and the file is whole.
TEST(TokenFileFormat, TwoWritersOfOneFileBothFinish) {
  const std::string dir = temp_dir("tftwo");
  TokenFileWriter a(dir + "/x.tok", 100, {0, 0}), b(dir + "/x.tok", 100, {0, 0});
  a.add_document({1, 2, 3});
  b.add_document({1, 2, 3});
  a.finish();
  b.finish();
  const TokenFile f = TokenFile::open(dir + "/x.tok");
  EXPECT_EQ(f.num_tokens(), 3u);
  EXPECT_EQ(f.num_docs(), 1u);
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) entries += e.is_regular_file();
  EXPECT_EQ(entries, 1u) << "a temporary file was left behind";
}

// ---- Batching

TEST(Batching, PadModeFollowsMiniMindsRule) {
  // Stored documents are [bos] body [eos]; max_seq_len 6 keeps bos + body[:4] + eos.
  const std::string path = make_token_file(
      temp_dir("pad") + "/p.tok", {{1, 5, 0, 7, 2}, {1, 8, 2}, {1, 9, 10, 11, 12, 13, 14, 2}});
  TokenFile f = TokenFile::open(path);
  BatchSampler s(f, "pad", 3, 6, 42);
  // The pad id inside a text (<|endoftext|> typed in it) is masked too, as MiniMind's
  // labels[input_ids == pad] = -100 does.
  const std::vector<std::vector<int64_t>> rows = {
      {1, 5, 0, 7, 2, 0}, {1, 8, 2, 0, 0, 0}, {1, 9, 10, 11, 12, 2}};
  const std::vector<std::vector<int64_t>> labels = {
      {1, 5, -100, 7, 2, -100}, {1, 8, 2, -100, -100, -100}, {1, 9, 10, 11, 12, 2}};
  for (int64_t b = 0; b < 4; ++b) {  // every batch is one epoch: each document once
    Batch batch = s.next();
    ASSERT_EQ(batch.input_ids.sizes(), (std::vector<int64_t>{3, 6}));
    std::set<size_t> seen;
    for (int64_t r = 0; r < 3; ++r) {
      auto row = std::vector<int64_t>(batch.input_ids[r].data_ptr<int64_t>(),
                                      batch.input_ids[r].data_ptr<int64_t>() + 6);
      auto lab = std::vector<int64_t>(batch.labels[r].data_ptr<int64_t>(),
                                      batch.labels[r].data_ptr<int64_t>() + 6);
      size_t k = std::find(rows.begin(), rows.end(), row) - rows.begin();
      ASSERT_LT(k, rows.size()) << "unexpected row " << batch.input_ids[r];
      EXPECT_EQ(lab, labels[k]);
      seen.insert(k);
    }
    EXPECT_EQ(seen.size(), 3u);
  }
}

TEST(Batching, PackModeRowsAreWindowsOfTheStream) {
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 20; ++d) docs.push_back({1, 10 + d, 40 + d, 70 + d % 9, 2});
  TokenFile f = TokenFile::open(make_token_file(temp_dir("pack") + "/k.tok", docs));
  std::vector<int64_t> stream(f.num_tokens());
  f.copy(0, f.num_tokens(), stream.data());
  BatchSampler s(f, "pack", 4, 8, 7);
  std::set<int64_t> starts;
  for (int b = 0; b < 10; ++b) {
    Batch batch = s.next();
    ASSERT_EQ(batch.input_ids.sizes(), (std::vector<int64_t>{4, 9}));  // max_seq_len + 1
    EXPECT_TRUE(torch::equal(batch.input_ids, batch.labels));
    for (int64_t r = 0; r < 4; ++r) {
      const int64_t* row = batch.input_ids[r].data_ptr<int64_t>();
      auto it = std::search(stream.begin(), stream.end(), row, row + 9);
      ASSERT_NE(it, stream.end());
      starts.insert(it - stream.begin());
    }
  }
  EXPECT_GT(starts.size(), 20u);  // windows start all over the stream
}

TEST(Batching, DeterministicAndResumable) {
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 50; ++d) docs.push_back({1, 3 + d % 90, 5 + d % 80, 2});
  TokenFile f = TokenFile::open(make_token_file(temp_dir("resume") + "/r.tok", docs));
  for (const char* mode : {"pack", "pad"}) {
    SCOPED_TRACE(mode);
    BatchSampler a(f, mode, 4, 6, 123), b(f, mode, 4, 6, 123), other(f, mode, 4, 6, 124);
    std::vector<Batch> seq;
    for (int i = 0; i < 30; ++i) seq.push_back(a.next());  // 30 * 4 rows > 2 epochs of 50 docs
    for (int i = 0; i < 30; ++i) EXPECT_TRUE(torch::equal(b.next().input_ids, seq[i].input_ids));
    // A resumed sampler continues with exactly the batches the first one drew.
    BatchSampler resumed(f, mode, 4, 6, 123);
    resumed.set_position(17);
    for (int i = 17; i < 30; ++i)
      EXPECT_TRUE(torch::equal(resumed.next().input_ids, seq[i].input_ids));
    EXPECT_FALSE(torch::equal(other.batch(0).input_ids, seq[0].input_ids));
    // Rank r of 2 draws global batches 2i + r.
    BatchSampler r0(f, mode, 4, 6, 123, 0, 2), r1(f, mode, 4, 6, 123, 1, 2);
    EXPECT_TRUE(torch::equal(r0.batch(3).input_ids, seq[6].input_ids));
    EXPECT_TRUE(torch::equal(r1.batch(3).input_ids, seq[7].input_ids));
  }
}

TEST(Batching, TooSmallForOneBatchIsAnError) {
  TokenFile f =
      TokenFile::open(make_token_file(temp_dir("small") + "/s.tok", {{1, 5, 2}, {1, 6, 2}}));
  EXPECT_THROW(BatchSampler(f, "pack", 2, 6, 0), DataError);  // 6 tokens < 7
  EXPECT_THROW(BatchSampler(f, "pad", 3, 6, 0), DataError);   // 2 docs < batch 3
  EXPECT_NO_THROW(BatchSampler(f, "pack", 2, 5, 0));
}

// ---- Preparation and cache

TEST(Prepare, ValidationMaskIsExactAndStable) {
  std::vector<bool> m = validation_mask(4948, 0.02);
  EXPECT_EQ(std::count(m.begin(), m.end(), true), 99);  // ceil(0.02 * 4948)
  EXPECT_EQ(validation_mask(4948, 0.02), m);
  EXPECT_EQ(std::count(m.begin(), m.begin() + 2474, true) > 20, true);  // spread out
  std::vector<bool> none = validation_mask(100, 0.0);
  EXPECT_EQ(std::count(none.begin(), none.end(), true), 0);
}

TEST(Prepare, CacheHitsOnSameContentAndMissesOnChange) {
  const std::string dir = temp_dir("prep");
  DataConfig d = corpus_config(dir, "a.jsonl", sample_corpus(200));
  d.val_fraction = 0.05;
  PreparedData first = prepare_data(d, 800, 2);
  EXPECT_FALSE(first.tokenizer_cached);
  EXPECT_FALSE(first.tokens_cached);
  EXPECT_GT(first.train_tokens, 10000u);
  EXPECT_EQ(first.val_docs, 12u);  // ceil(0.05 * 240 records)
  const auto mtime = fs::last_write_time(first.train_path);

  // Same tokens on two runs: preparing from scratch again writes byte-identical files.
  {
    DataConfig fresh = d;
    fresh.cache_dir = dir + "/cache2";
    PreparedData again = prepare_data(fresh, 800, 1);  // other thread count too
    auto bytes = [](const std::string& path) {
      std::ifstream in(path, std::ios::binary);
      return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    };
    // (compared as booleans: a mismatch would print megabytes)
    EXPECT_TRUE(bytes(again.train_path) == bytes(first.train_path))
        << again.train_path << " vs " << first.train_path;
    EXPECT_TRUE(bytes(again.val_path) == bytes(first.val_path))
        << again.val_path << " vs " << first.val_path;
    EXPECT_TRUE(bytes(again.tokenizer_path) == bytes(first.tokenizer_path));
  }

  PreparedData second = prepare_data(d, 800, 2);
  EXPECT_TRUE(second.tokenizer_cached);
  EXPECT_TRUE(second.tokens_cached);
  EXPECT_EQ(second.train_path, first.train_path);
  EXPECT_EQ(fs::last_write_time(second.train_path), mtime);  // not rewritten

  // The same bytes under another name: still a hit (the key is the content).
  fs::copy_file(dir + "/a.jsonl", dir + "/copy.jsonl");
  d.train = dir + "/copy.jsonl";
  EXPECT_TRUE(prepare_data(d, 800, 2).tokens_cached);

  // A changed corpus is prepared again, into new files.
  write_text(dir + "/copy.jsonl", sample_corpus(200) + jsonl_line("one more record"));
  PreparedData changed = prepare_data(d, 800, 2);
  EXPECT_FALSE(changed.tokens_cached);
  EXPECT_NE(changed.train_path, first.train_path);
  EXPECT_EQ(changed.train_docs + changed.val_docs, first.train_docs + first.val_docs + 1);

  // A damaged cached file is noticed and rebuilt.
  fs::resize_file(first.train_path, 100);
  d.train = dir + "/a.jsonl";
  PreparedData rebuilt = prepare_data(d, 800, 2);
  EXPECT_FALSE(rebuilt.tokens_cached);
  EXPECT_EQ(TokenFile::open(rebuilt.train_path).num_tokens(), first.train_tokens);
}

TEST(Prepare, GivenTokenizerMustMatchVocabSize) {
  const std::string dir = temp_dir("prepvocab");
  DataConfig d = corpus_config(dir, "a.jsonl", sample_corpus(100));
  PreparedData p = prepare_data(d, 700, 2);
  d.tokenizer = p.tokenizer_path;
  EXPECT_TRUE(prepare_data(d, 700, 2).tokenizer_cached);
  // The same condition as minimind-eval's tokenizer check, with the same error.
  const std::string msg = test::error_of<TokenizerError>([&] { prepare_data(d, 6400, 2); });
  EXPECT_NE(msg.find("has 700 pieces but model.vocab_size is 6400"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint: set model.vocab_size to 700"), std::string::npos) << msg;
  d.tokenizer = dir + "/missing.model";
  EXPECT_THROW(prepare_data(d, 700, 2), DataError);
}

// A corpus too small for model.vocab_size pieces: the hint says to lower it (to the size
// sentencepiece names) or give more text; a size too small for the bytes says to raise it.
TEST(Prepare, TokenizerSizeHintsPointTheRightWay) {
  const std::string dir = temp_dir("prephint");
  DataConfig d = corpus_config(dir, "tiny.jsonl", jsonl_line("A tiny corpus of one short record."));
  d.val_fraction = 0;
  const std::string big = test::error_of<TokenizerError>([&] { prepare_data(d, 6400, 1); });
  EXPECT_NE(big.find("hint: the corpus is too small for that many pieces: lower model.vocab_size "
                     "(at most "),
            std::string::npos)
      << big;
  EXPECT_NE(big.find("or give more text"), std::string::npos) << big;
  EXPECT_EQ(big.find("raise model.vocab_size"), std::string::npos) << big;
  const std::string small = test::error_of<TokenizerError>([&] { prepare_data(d, 100, 1); });
  EXPECT_NE(small.find("raise model.vocab_size"), std::string::npos) << small;
}

TEST(Prepare, SeparateValidationFile) {
  const std::string dir = temp_dir("prepval");
  write_text(dir + "/train.jsonl", sample_corpus(120));
  write_text(dir + "/val.jsonl", jsonl_line("Held-out text one.") + jsonl_line("And two."));
  DataConfig d;
  d.train = dir + "/train.jsonl";
  d.val = dir + "/val.jsonl";
  d.cache_dir = dir + "/cache";
  PreparedData p = prepare_data(d, 600, 2);
  EXPECT_EQ(p.val_docs, 2u);
  EXPECT_EQ(p.train_docs, 160u);  // 120 + 40 extra records, none held out
}

TEST(Prepare, StrictRefusesBadLinesEvenWhenTokensAreCached) {
  const std::string dir = temp_dir("prepstrict");
  DataConfig d = corpus_config(dir, "a.jsonl", sample_corpus(100) + "{broken\n");
  EXPECT_FALSE(prepare_data(d, 700, 2).tokens_cached);  // not strict: the line is skipped
  d.strict = true;
  const std::string msg = test::error_of<DataError>([&] { prepare_data(d, 700, 2); });
  EXPECT_NE(msg.find("a.jsonl:141: invalid JSON"), std::string::npos) << msg;
}

TEST(Prepare, DataPathsAreCheckedUpFrontNamingTheKey) {
  const std::string dir = temp_dir("preppaths");
  Config cfg = load_config_string("data:\n  train: " + dir + "\n", "paths.yaml");
  std::string msg = test::error_of<DataError>([&] { check_data_paths(cfg); });
  EXPECT_NE(
      msg.find("data.train (paths.yaml line 2): '" + dir + "' is a directory, not a regular file"),
      std::string::npos)
      << msg;
  apply_override(cfg, "data.train=" + dir + "/missing.jsonl");
  msg = test::error_of<DataError>([&] { check_data_paths(cfg); });
  EXPECT_NE(msg.find("'" + dir + "/missing.jsonl' does not exist"), std::string::npos) << msg;
  // prepare_data itself names a directory instead of reading it as an empty file.
  DataConfig d;
  d.train = dir;
  d.cache_dir = dir + "/cache";
  msg = test::error_of<DataError>([&] { prepare_data(d, 700, 1); });
  EXPECT_NE(msg.find("is a directory, not a JSONL file"), std::string::npos) << msg;
}

TEST(Prepare, OneRecordStaysForTraining) {
  EXPECT_EQ(validation_mask(1, 0.02), std::vector<bool>{false});
  const std::vector<bool> two = validation_mask(2, 0.9);
  EXPECT_EQ(std::count(two.begin(), two.end(), true), 1);
  const std::string dir = temp_dir("prepone");
  DataConfig d = corpus_config(dir, "one.jsonl",
                               jsonl_line(test::read_text(test::source_path("data/README.md"))));
  const PreparedData p = prepare_data(d, 700, 1);
  EXPECT_EQ(p.train_docs, 1u);
  EXPECT_EQ(p.val_docs, 0u);
}

TEST(Prepare, TooSmallAVocabularyNamesTheKey) {
  const std::string dir = temp_dir("prepsmallvocab");
  DataConfig d = corpus_config(dir, "a.jsonl", sample_corpus(50));
  const std::string msg = test::error_of<TokenizerError>([&] { prepare_data(d, 100, 1); });
  EXPECT_NE(msg.find("model.vocab_size = 100"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint: a byte-fallback BPE needs at least 256"), std::string::npos) << msg;
}

// A log sink that asks for a stop when a message containing `trigger` is logged: the
// stop then arrives between two passes of the preparation, as a Ctrl-C would.
class StopOnMessage : public spdlog::sinks::base_sink<std::mutex> {
 public:
  StopOnMessage(StopFlag& flag, std::string trigger) : flag_(flag), trigger_(std::move(trigger)) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (std::string_view(msg.payload.data(), msg.payload.size()).find(trigger_) !=
        std::string_view::npos)
      flag_.request(SIGINT);
  }
  void flush_() override {}

 private:
  StopFlag& flag_;
  std::string trigger_;
};

TEST(Prepare, AStopRequestEndsItAndLeavesTheCacheAsItWas) {
  const std::string dir = temp_dir("prepstop");
  DataConfig d = corpus_config(dir, "a.jsonl", sample_corpus(100));
  StopFlag stop;
  // Before anything: Interrupted (exit status 130 in the mains), no tokenizer, no files.
  stop.request(SIGINT);
  try {
    prepare_data(d, 700, 2, *spdlog::default_logger(), &stop);
    ADD_FAILURE() << "no Interrupted";
  } catch (const Interrupted& e) {
    EXPECT_EQ(e.signal(), SIGINT);
    EXPECT_NE(std::string(e.what()).find("interrupted while preparing the data"),
              std::string::npos);
  }
  EXPECT_TRUE(fs::is_empty(d.cache_dir + "/tokenizers"));
  EXPECT_FALSE(fs::exists(d.cache_dir + "/tokens"));

  // With a cached tokenizer the token files are made next: a stop after the counting pass
  // lands while both writers are open. Their temporaries go; nothing is left in the cache.
  stop.clear();
  d.tokenizer = prepare_data(d, 700, 2).tokenizer_path;
  fs::remove_all(d.cache_dir + "/tokens");
  spdlog::logger log("stop-on-count", std::make_shared<StopOnMessage>(stop, "records"));
  EXPECT_THROW(prepare_data(d, 700, 2, log, &stop), Interrupted);
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(d.cache_dir + "/tokens"))
    files += e.is_regular_file();
  EXPECT_EQ(files, 0u);
  // And the next run prepares the data as if nothing had happened.
  stop.clear();
  PreparedData p = prepare_data(d, 700, 2, *spdlog::default_logger(), &stop);
  EXPECT_FALSE(p.tokens_cached);
  EXPECT_GT(p.train_tokens, 1000u);
}

namespace minimind {
namespace {

// A tokenizer.json feature the native reader does not implement is refused naming the JSON
// field, never read into other ids: MiniMind's file with one field changed at a time.
TEST(TokenizerJson, RefusesWhatItDoesNotImplementNamingTheField) {
  const std::string dir = test::temp_dir("tokenizer_json");
  std::ifstream in(test::source_path("tests/data/minimind-tokenizer/tokenizer.json"));
  const nlohmann::json original = nlohmann::json::parse(in);
  struct Case {
    const char* pointer;
    nlohmann::json value;
    const char* named;
  };
  for (const Case& c : {
           Case{"/normalizer", {{"type", "NFC"}}, "normalizer"},
           Case{"/model/type", "WordPiece", "model.type is WordPiece"},
           Case{"/model/byte_fallback", true, "model.byte_fallback"},
           Case{"/model/dropout", 0.1, "model.dropout"},
           Case{"/pre_tokenizer", {{"type", "Whitespace"}}, "pre_tokenizer"},
           Case{"/pre_tokenizer/add_prefix_space", true, "pre_tokenizer.add_prefix_space"},
           Case{"/post_processor", {{"type", "TemplateProcessing"}}, "post_processor"},
           Case{"/decoder", {{"type", "WordPiece"}}, "decoder"},
           Case{"/added_tokens/1/lstrip", true, "added_tokens[1].lstrip"},
           Case{"/model/merges/7", nlohmann::json::array({"no such", "token"}), "model.merges[7]"},
           Case{"/model/vocab/zzzq", 5, "(duplicate id)"},
           Case{"/model/vocab/zzzq", int64_t{1} << 31, "model.vocab[\"zzzq\"] is not an id"},
           Case{"/model/type", 7, "not a tokenizer.json of the expected shape"},
           Case{"/added_tokens/3", "<|box_start|>",
                "added_tokens holds an entry that is not an object"},
       }) {
    SCOPED_TRACE(c.pointer);
    nlohmann::json changed = original;
    changed[nlohmann::json::json_pointer(c.pointer)] = c.value;
    const std::string path = dir + "/tokenizer.json";
    std::ofstream(path) << changed.dump();
    try {
      Tokenizer::from_file(path);
      ADD_FAILURE() << "accepted";
    } catch (const TokenizerError& e) {
      EXPECT_NE(std::string(e.what()).find(c.named), std::string::npos) << e.what();
    }
  }
  // A truncated file: named, as not JSON.
  std::ofstream(dir + "/tokenizer.json") << original.dump().substr(0, 5000);
  try {
    Tokenizer::from_file(dir + "/tokenizer.json");
    ADD_FAILURE() << "accepted";
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/tokenizer.json: not valid JSON"),
              std::string::npos)
        << e.what();
  }
  // A tokenizer_config.json beside the file naming a token the file lacks: named.
  std::ofstream(dir + "/tokenizer.json") << original.dump();
  std::ofstream(dir + "/tokenizer_config.json") << R"({"bos_token": "<|nope|>"})";
  try {
    Tokenizer::from_file(dir + "/tokenizer.json");
    ADD_FAILURE() << "accepted";
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("bos token '<|nope|>' is not in the vocabulary"),
              std::string::npos)
        << e.what();
  }
}

// pad, bos and eos at other ids than MiniMind's, named by a tokenizer_config.json beside the
// file, GPT-2's way (bos = eos = <|endoftext|>, here id 0; pad <|im_end|>, id 2): documents
// open and close with them, the token files record the pad id, pad-mode rows are padded
// with it and its positions masked, and the cache keys on them.
TEST(TokenizerJson, SpecialsAtAnyIdsReachTheTokenFilesAndBatches) {
  const std::string dir = test::temp_dir("specials");
  fs::copy_file(test::source_path("tests/data/tiny-bpe/tokenizer.json"), dir + "/tokenizer.json");
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"pad_token": "<|im_end|>", "bos_token": {"content": "<|endoftext|>"},
             "eos_token": "<|endoftext|>"})";
  const Tokenizer tok = Tokenizer::from_file(dir + "/tokenizer.json");
  EXPECT_EQ(tok.specials(), (SpecialIds{2, 0, 0}));
  const std::vector<int32_t> doc = tok.encode_document("Emma");
  EXPECT_EQ(doc.front(), 0);
  EXPECT_EQ(doc.back(), 0);
  EXPECT_EQ(nlohmann::json::parse(tok.config_json()),
            (nlohmann::json{{"pad_token", "<|im_end|>"},
                            {"bos_token", "<|endoftext|>"},
                            {"eos_token", "<|endoftext|>"}}));

  std::string corpus;
  for (int i = 0; i < 60; ++i) corpus += "{\"text\": \"Emma said " + std::to_string(i) + ".\"}\n";
  DataConfig d = corpus_config(dir, "a.jsonl", corpus);
  d.tokenizer = dir + "/tokenizer.json";
  d.val_fraction = 0;
  const PreparedData p = prepare_data(d, tok.vocab_size(), 1);
  const TokenFile f = TokenFile::open(p.train_path);
  EXPECT_EQ(f.pad_id(), 2);
  for (uint64_t i = 0; i < f.num_docs(); ++i) {
    ASSERT_EQ(f.bos_of(i), 0);
    ASSERT_EQ(f.eos_of(i), 0);
  }
  BatchSampler s(f, "pad", 4, 512, 1);
  const Batch b = s.next();
  const int64_t L = b.input_ids.size(1);
  const int64_t* ids = b.input_ids.data_ptr<int64_t>();
  const int64_t* labels = b.labels.data_ptr<int64_t>();
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[L - 1], 2) << "a 512-token row of a short record ends in padding";
  EXPECT_EQ(labels[0], 0) << "bos (id 0) is not the pad id: learnt";
  EXPECT_EQ(labels[L - 1], -100);

  // The same corpus and file with MiniMind's names (no config beside it): other token files.
  fs::remove(dir + "/tokenizer_config.json");
  EXPECT_NE(prepare_data(d, tok.vocab_size(), 1).train_path, p.train_path);
}

// Both kinds behind one interface: the kind is read from the bytes, and a tokenizer.json's
// ids, pieces and types are its own (MiniMind's: <|im_end|> = 2, special; "Ġ" = 256).
TEST(TokenizerJson, OneInterfaceForBothKinds) {
  const Tokenizer t =
      Tokenizer::from_file(test::source_path("tests/data/minimind-tokenizer/tokenizer.json"));
  EXPECT_TRUE(t.is_hf_json());
  EXPECT_EQ(t.vocab_size(), 6400);
  EXPECT_EQ(t.encode("a <|im_end|>b"), (std::vector<int32_t>{100, 256, 2, 101}));
  EXPECT_EQ(t.encode_document("a"), (std::vector<int32_t>{1, 100, 2}));
  EXPECT_EQ(t.piece(256), "\xC4\xA0");  // "Ġ", the space byte
  EXPECT_EQ(t.piece_type(2), PieceType::control);
  EXPECT_EQ(t.piece_type(25), PieceType::user_defined);  // <think>: added, not special
  EXPECT_EQ(t.decode({1931, 628, 1190, 3552}), "It's 2024");
  EXPECT_EQ(t.decode({256, 3084}).substr(0, 1), " ");
  EXPECT_EQ(t.unknown_id(), -1);
  // A piece of a million bytes (one run of spaces) is merged in O(n log n), and back.
  const std::string spaces(1 << 20, ' ');
  EXPECT_EQ(t.decode(t.encode(spaces + "x")), spaces + "x");
}

}  // namespace
}  // namespace minimind
