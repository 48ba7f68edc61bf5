// Chat data: records refused with their reason, the templates' text on hand-written
// conversations, tojson as Python writes it, MiniMind's augmentations and label rule, and a
// sentencepiece model reading its special tokens in text. (Whole corpora against Jinja, the
// Rust library and a Python label rule: tests/chat_exact.sh.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "minimind/data/batcher.h"
#include "minimind/data/chat.h"
#include "minimind/data/prepare.h"
#include "minimind/data/sft.h"
#include "minimind/data/tokenizer.h"
#include "minimind/eval/evaluate.h"
#include "minimind/model/minimind_model.h"
#include "support/test_support.h"

using namespace minimind;

namespace {

Conversation parsed(const std::string& line) {
  Conversation c;
  const std::string why = parse_conversation(line, c);
  EXPECT_EQ(why, "") << line;
  return c;
}

std::string why_not(const std::string& line) {
  Conversation c;
  return parse_conversation(line, c);
}

const Tokenizer& minimind3() {
  static const Tokenizer tok =
      Tokenizer::from_file(test::source_path("tests/data/minimind-tokenizer/tokenizer.json"));
  return tok;
}

}  // namespace

TEST(ChatRecords, BadOnesSayWhy) {
  EXPECT_EQ(why_not("[1, 2]"), "a JSON array, not an object");
  EXPECT_EQ(why_not("{\"text\": \"hi\"}"), "no \"conversations\"");
  EXPECT_EQ(why_not("{\"conversations\": []}"), "an empty conversation");
  EXPECT_EQ(why_not("{\"conversations\": \"hi\"}"), "\"conversations\" is string, not a list");
  EXPECT_EQ(why_not(R"({"conversations": [{"role": "bot", "content": "x"}]})"),
            "turn 1: unknown role \"bot\" (system, user, assistant or tool)");
  EXPECT_EQ(why_not(R"({"conversations": [{"content": "x"}]})"), "turn 1: no string \"role\"");
  EXPECT_EQ(why_not(R"({"conversations": [{"role": "user", "content": 5}]})"),
            "turn 1: \"content\" is number, not a string");
  EXPECT_EQ(why_not(R"({"conversations": [{"role": "system", "content": "s", "tools": "[{"}]})"),
            "turn 1: \"tools\" is a string that is not JSON");
  EXPECT_EQ(why_not(R"({"conversations": [{"role": "system", "content": "s", "tools": "{}"}]})"),
            "turn 1: \"tools\" holds a JSON object, not a list");
  EXPECT_EQ(why_not(R"({"conversations": [{"role": "user", "content": "q"},
              {"role": "assistant", "content": "", "tool_calls": "[{\"arguments\": {}}]"}]})"),
            "turn 2: a tool call has no string \"name\"");
  EXPECT_EQ(why_not(R"({"conversations": [{"role": "assistant", "content": "",
              "tool_calls": [{"name": "f"}]}]})"),
            "turn 1: a tool call has no \"arguments\"");
  EXPECT_EQ(why_not(R"({"conversations": [{"role": "system"}, {"role": "user", "content": "q"}]})"),
            "turn 1: a system turn without content");
  // Absent, null and empty fields are fine.
  EXPECT_EQ(why_not(R"({"conversations": [{"role": "user", "content": null, "tools": "",
              "tool_calls": null, "reasoning_content": null}]})"),
            "");
}

// MiniMind-3's template by hand: the empty think block on every answer, reasoning from the
// field or from content before </think>, a later system turn as a user turn, consecutive
// tool turns in one user block, the generation prompt with and without thinking.
TEST(ChatTemplate, MiniMind3WritesWhatTransformersWrites) {
  const ChatTemplate t = ChatTemplate::minimind3();
  const Conversation c = parsed(R"({"conversations": [
      {"role": "user", "content": "q1"},
      {"role": "assistant", "content": "a1", "reasoning_content": "\nr1\n"},
      {"role": "system", "content": "later"},
      {"role": "tool", "content": "t1"}, {"role": "tool", "content": "t2"},
      {"role": "assistant", "content": "pre<think>\n\nr2\n</think>\n\na2"}]})");
  EXPECT_EQ(t.render(c),
            "<|im_start|>user\nq1<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>\n"
            "<|im_start|>system\nlater<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nt1\n</tool_response>\n<tool_response>\nt2\n"
            "</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n");
  const Conversation q = parsed(R"({"conversations": [{"role": "user", "content": "hi"}]})");
  EXPECT_EQ(t.render(q, {true, false}),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(t.render(q, {true, true}),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
}

TEST(ChatTemplate, MiniMind2HasADefaultSystemPromptAndNoThinkBlocks) {
  const ChatTemplate t = ChatTemplate::identify(
      nlohmann::json::parse(test::read_text(test::source_path(
                                "tests/data/minimind-tokenizer/minimind2/tokenizer_config.json")))
          .at("chat_template")
          .get<std::string>(),
      "minimind2");
  EXPECT_EQ(t.kind(), ChatTemplate::Kind::minimind2);
  const Conversation c = parsed(
      R"({"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})");
  EXPECT_EQ(
      t.render(c),
      "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
      "<|im_start|>assistant\na<|im_end|>\n");
  EXPECT_EQ(t.default_system_block(), system_block("You are a helpful assistant"));
}

// A template changed by one byte is refused, naming the field and the file.
TEST(ChatTemplate, AnotherTextIsRefused) {
  std::string text =
      nlohmann::json::parse(
          test::read_text(test::source_path("tests/data/minimind-tokenizer/tokenizer_config.json")))
          .at("chat_template")
          .get<std::string>();
  EXPECT_EQ(ChatTemplate::identify(text, "x").kind(), ChatTemplate::Kind::minimind3);
  text.back() = ' ';
  try {
    ChatTemplate::identify(text, "dir/tokenizer_config.json");
    FAIL() << "a changed template was taken";
  } catch (const TokenizerError& e) {
    EXPECT_NE(e.message().find("chat_template of 'dir/tokenizer_config.json'"), std::string::npos)
        << e.message();
  }
}

// json.dumps(x, ensure_ascii=False) as Python writes it (values printed by CPython 3.11).
// Our chat_template text for MiniMind-3 (what exports of the tool's own tokenizers carry)
// renders every test conversation as MiniMind-3's own text does under Jinja as transformers
// runs it (python3-jinja2, tests/reference/chat_ref.py), whole and as the prompt of an answer
// with the think block empty or open; and it is recognised as MiniMind-3's.
TEST(ChatTemplate, OurJinjaTextRendersAsMiniMind3s) {
  const std::string& ours = ChatTemplate::minimind3().jinja();
  EXPECT_EQ(ChatTemplate::identify(ours, "ours").kind(), ChatTemplate::Kind::minimind3);
  const std::string dir = test::temp_dir("chat_jinja"), config = dir + "/tokenizer_config.json";
  test::write_text(config, nlohmann::json{{"chat_template", ours}}.dump());
  const std::string render = std::string(MINIMIND_PYTHON) + " " +
                             test::source_path("tests/reference/chat_ref.py") + " render ";
  const std::string corpus = " " + test::source_path("tests/data/chat-corpus.jsonl") + " ";
  for (const char* prompt : {"none", "answer", "think"}) {
    SCOPED_TRACE(prompt);
    const test::Command want = test::run_command(
        render + test::source_path("tests/data/minimind-tokenizer/tokenizer_config.json") + corpus +
        prompt);
    const test::Command got = test::run_command(render + config + corpus + prompt);
    ASSERT_EQ(want.status, 0) << want.err;
    ASSERT_EQ(got.status, 0) << got.err;
    EXPECT_EQ(std::count(want.out.begin(), want.out.end(), '\n'), 21);
    EXPECT_EQ(got.out, want.out);
  }
}

TEST(ChatTemplate, ToJsonIsPythonsJsonDumps) {
  const auto j = nlohmann::ordered_json::parse(
      R"({"b": 1, "a": [1.0, 1e-05, 1e16, 1e15, 0.0001, -2.5e-07, 123.456, 5e-324],
          "s": "é \"q\" \\ \n\t\u0001 ü", "n": null, "t": true})");
  EXPECT_EQ(python_json(j),
            R"({"b": 1, "a": [1.0, 1e-05, 1e+16, 1000000000000000.0, 0.0001, -2.5e-07, 123.456, )"
            R"(5e-324], "s": "é \"q\" \\ \n\t\u0001 ü", "n": null, "t": true})");
}

TEST(ChatAugmentation, SystemPromptsOnlyWithoutSystemTurnOrTools) {
  EXPECT_TRUE(
      may_add_system_prompt(parsed(R"({"conversations": [{"role": "user", "content": "q"}]})")));
  EXPECT_FALSE(may_add_system_prompt(parsed(
      R"({"conversations": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]})")));
  // Tools named on any turn keep the conversation as it is (MiniMind's pre_processing_chat).
  EXPECT_FALSE(may_add_system_prompt(
      parsed(R"({"conversations": [{"role": "user", "content": "q", "tools": "[]"}]})")));
  EXPECT_EQ(without_empty_think(
                "a<think>\n\n</think>\n\nb<think>\nx\n</think>\n\nc<think>\n\n</think>\n\n"),
            "ab<think>\nx\n</think>\n\nc");
  EXPECT_EQ(without_empty_think("nothing"), "nothing");
}

// The label rule on made-up ids: open = [7, 8], close = [9, 4]; a truncated answer runs to the
// row's end; the row's cap stops labels.
TEST(SftLabels, MiniMindsRule) {
  const std::vector<int32_t> open{7, 8}, close{9, 4};
  const std::vector<int64_t> ids{1, 7, 8, 5, 6, 9, 4, 3, 7, 8, 5, 9};
  const std::vector<int64_t> want{-100, -100, -100, 5, 6, 9, 4, -100, -100, -100, 5, 9};
  EXPECT_EQ(sft_labels(ids, open, close, 12), want);
  std::vector<int64_t> capped = want;
  capped[10] = capped[11] = -100;
  EXPECT_EQ(sft_labels(ids, open, close, 10), capped);
  EXPECT_EQ(sft_labels({7, 8}, open, close, 2), (std::vector<int64_t>{-100, -100}));
}

// A row as SFTDataset makes it: cut at the length, padded with the pad id, padding untrained.
TEST(SftEncoder, CutsPadsAndLabelsARow) {
  const SftEncoder enc(minimind3());
  EXPECT_EQ(enc.answer_open(), (std::vector<int32_t>{1, 1388, 570, 811, 234}));
  EXPECT_EQ(enc.answer_close(), (std::vector<int32_t>{2, 234}));
  const Conversation c = parsed(
      R"({"conversations": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]})");
  const std::vector<int32_t> ids = enc.encode(c);
  const SftRow whole = enc.row(ids, 0);
  EXPECT_EQ(whole.length, static_cast<int64_t>(ids.size()));
  const SftRow padded = enc.row(ids, static_cast<int64_t>(ids.size()) + 5);
  EXPECT_EQ(padded.length, whole.length);
  for (size_t i = ids.size(); i < padded.ids.size(); ++i) {
    EXPECT_EQ(padded.ids[i], 0);
    EXPECT_EQ(padded.labels[i], -100);
  }
  // The answer's last two ids (<|im_end|>, \n) are trained; the header is not.
  EXPECT_EQ(whole.labels.back(), 234);
  EXPECT_EQ(whole.labels[whole.labels.size() - 2], 2);
  const SftRow cut = enc.row(ids, 12);
  EXPECT_EQ(cut.ids.size(), 12u);
  EXPECT_EQ(cut.length, 12);
}

// A sentencepiece model (the tool's own tokenizers) reads its pad, bos and eos texts in a
// text as those ids, so the chat markers work with it; its template is MiniMind-3's.
TEST(SftEncoder, SentencepieceReadsItsSpecialTokensInText) {
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i)
    texts.push_back("Emma said hello to the assistant number " + std::to_string(i) + ".");
  std::vector<std::string_view> views(texts.begin(), texts.end());
  const Tokenizer tok = Tokenizer::from_bytes(Tokenizer::train(views, 400), "spm");
  const std::vector<int32_t> ids = tok.encode("<|im_start|>assistant\nHi<|im_end|>\n<|endoftext|>");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids[ids.size() - 3], 2);
  EXPECT_EQ(ids.back(), 0);
  EXPECT_EQ(tok.decode(ids), "assistant\nHi\n");  // sentencepiece's decoding drops them
  EXPECT_EQ(tok.chat_template().kind(), ChatTemplate::Kind::minimind3);
  const SftEncoder enc(tok);
  EXPECT_EQ(enc.answer_open().front(), 1);
  EXPECT_EQ(enc.answer_close(), (std::vector<int32_t>{2, tok.encode("\n").front()}));
}

namespace {

// The shipped test conversations prepared as chat data with MiniMind's tokenizer of
// `generation` ("" or "minimind2"), no validation split.
struct ChatData {
  explicit ChatData(const std::string& generation) {
    const std::string dir = test::temp_dir("chat_data_" + (generation.empty() ? "3" : generation));
    DataConfig d;
    d.train = test::source_path("tests/data/chat-corpus.jsonl");
    d.tokenizer =
        test::source_path("tests/data/minimind-tokenizer/" +
                          (generation.empty() ? "" : generation + "/") + "tokenizer.json");
    d.val_fraction = 0;
    d.mode = "sft";
    d.cache_dir = dir + "/cache";
    prepared = prepare_data(d, 6400, 1);
    tokens = TokenFile::open(prepared.train_path);
    index = std::make_shared<const SftIndex>(SftIndex::read(prepared.train_path));
    tok.emplace(Tokenizer::from_file(d.tokenizer));
    std::ifstream in(d.train);
    for (std::string line; std::getline(in, line);) conversations.push_back(parsed(line));
  }
  PreparedData prepared;
  TokenFile tokens;
  std::shared_ptr<const SftIndex> index;
  std::optional<Tokenizer> tok;
  std::vector<Conversation> conversations;
};

// The row's conversation and its length before padding, from its ids.
std::vector<int64_t> row_of(const Batch& b, int64_t r) {
  const torch::Tensor ids = b.input_ids[r].contiguous();
  return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
}

}  // namespace

// Training rows of chat data are MiniMind's rows, for both generations: with no augmentation
// (add_system_ratio 0, every empty think block kept) each row is its conversation's
// rendering as tokenize --chat makes it; with every augmentation (a system prompt wherever
// one may go, every empty think block removed) each row is the augmented conversation
// rendered and tokenised whole, though the sampler joins stored ids: the system block's ids
// and the rendering's after the template's default block.
TEST(ChatRows, AreTheAugmentedConversationRenderedAndTokenisedWhole) {
  for (const std::string generation : {"", "minimind2"}) {
    SCOPED_TRACE(generation.empty() ? "minimind-3" : generation);
    const ChatData data(generation);
    const SftEncoder enc(*data.tok);
    const int64_t N = static_cast<int64_t>(data.conversations.size()), L = 96;
    ASSERT_EQ(data.tokens.num_docs(), static_cast<uint64_t>(2 * N));
    for (const bool augmented : {false, true}) {
      SftRowsOptions o;
      o.add_system_ratio = augmented ? 1.0 : 0.0;
      o.empty_think_ratio = augmented ? 0.0 : 1.0;
      const BatchSampler sampler(data.tokens, "sft", N, L, 7, 0, 1, data.index, o);
      const Batch b = sampler.batch(0);  // one epoch: every conversation once
      int64_t with_prompt = 0;
      std::set<std::vector<int64_t>> got;
      for (int64_t r = 0; r < N; ++r) got.insert(row_of(b, r));
      for (int64_t c = 0; c < N; ++c) {
        const Conversation& conv = data.conversations[static_cast<size_t>(c)];
        std::vector<std::string> texts;
        if (!augmented) {
          texts.push_back(enc.chat_template().render(conv));
        } else if (may_add_system_prompt(conv)) {
          // Which of the ten prompts a row took is the draw's: any one of them.
          for (const char* p : kSystemPrompts) {
            Conversation with = conv;
            with.messages.insert(with.messages.begin(),
                                 ChatMessage{"system", p, {}, {}, {}, false});
            texts.push_back(without_empty_think(enc.chat_template().render(with)));
          }
        } else {
          texts.push_back(without_empty_think(enc.chat_template().render(conv)));
        }
        bool found = false;
        for (size_t k = 0; k < texts.size() && !found; ++k) {
          const SftRow want = enc.row(data.tok->encode(texts[k]), L);
          found = got.count(want.ids) > 0;
          with_prompt += found && texts.size() > 1;
        }
        EXPECT_TRUE(found) << "conversation " << c + 1;
      }
      if (augmented) {
        EXPECT_GT(with_prompt, 5);  // not vacuous: prompts were put first
      }
      // Labels: MiniMind's rule on each row's ids.
      for (int64_t r = 0; r < N; ++r) {
        const torch::Tensor lab = b.labels[r].contiguous();
        EXPECT_EQ(std::vector<int64_t>(lab.data_ptr<int64_t>(), lab.data_ptr<int64_t>() + L),
                  sft_labels(row_of(b, r), enc.answer_open(), enc.answer_close(), L));
      }
    }
  }
}

// The draws: over many epochs, a system prompt on about add_system_ratio of the rows that
// may take one, and empty think blocks kept on about empty_think_ratio of the rows; the same
// rows for the same seed, others for another.
TEST(ChatRows, DrawTheAugmentationsAtTheirRates) {
  const ChatData data("");
  const int64_t N = static_cast<int64_t>(data.conversations.size()), L = 64;
  SftRowsOptions o;  // MiniMind's 0.2 and 0.2
  const BatchSampler sampler(data.tokens, "sft", N, L, 11, 0, 1, data.index, o);
  int64_t may = 0, prompted = 0, rows = 0, kept = 0;
  const int32_t think = data.tok->encode("<think>").front();
  for (int64_t epoch = 0; epoch < 200; ++epoch) {
    const Batch b = sampler.batch(epoch);
    for (int64_t r = 0; r < N; ++r) {
      const std::vector<int64_t> row = row_of(b, r);
      bool has_system = false;
      for (const auto& block : data.index->system)
        has_system |= std::equal(block.begin(), block.end(), row.begin());
      prompted += has_system;
      const bool has_think = std::find(row.begin(), row.end(), think) != row.end();
      kept += has_think;
      ++rows;
    }
  }
  for (int64_t c = 0; c < N; ++c) may += data.index->may_add_system[static_cast<size_t>(c)];
  const double system_share = static_cast<double>(prompted) / static_cast<double>(200 * may);
  EXPECT_NEAR(system_share, 0.2, 0.03);
  // Every conversation of the corpus has think blocks (MiniMind-3 writes one per answer), most
  // of them empty: the kept share is near 0.2 plus the rows whose blocks are not empty.
  const double kept_share = static_cast<double>(kept) / static_cast<double>(rows);
  EXPECT_GT(kept_share, 0.15);
  EXPECT_LT(kept_share, 0.5);
  const BatchSampler same(data.tokens, "sft", N, L, 11, 0, 1, data.index, o);
  EXPECT_TRUE(torch::equal(same.batch(3).input_ids, sampler.batch(3).input_ids));
  const BatchSampler other(data.tokens, "sft", N, L, 12, 0, 1, data.index, o);
  EXPECT_FALSE(torch::equal(other.batch(3).input_ids, sampler.batch(3).input_ids));
}

// Packing by hand: each length to the first open row with room, the oldest of two open rows
// closed when none has.
TEST(PackRows, FirstFitOverTheOpenRows) {
  const RowPacking p = pack_rows({5, 3, 4, 2, 6, 1}, 8, 2);
  EXPECT_EQ(p.first, (std::vector<uint32_t>{0, 2, 5, 6}));
  EXPECT_EQ(p.items, (std::vector<uint32_t>{0, 1, 2, 3, 5, 4}));
  EXPECT_EQ(p.rows(), 3);
}

// Packed chat rows hold the padded rows' conversations: over three epochs, the packed rows'
// conversations in row order are each epoch's conversations once, each with the ids and
// labels of its padded row (the same draws), positions attended from its own start; rows
// hold no more than max_seq_len ids, and a batch is a pure function of its index.
TEST(ChatRows, PackedRowsHoldThePaddedRowsConversations) {
  const ChatData data("");
  const int64_t N = static_cast<int64_t>(data.conversations.size()), L = 160;
  SftRowsOptions o;  // MiniMind's augmentations, drawn alike in both
  const BatchSampler padded(data.tokens, "sft", N, L, 5, 0, 1, data.index, o);
  o.packing = true;
  const BatchSampler packed(data.tokens, "sft", 3, L, 5, 0, 1, data.index, o);
  const int32_t pad = data.tokens.pad_id();
  int64_t batch = 0, real = 0, positions = 0;
  std::vector<std::multiset<std::vector<int64_t>>> got(3);
  for (int64_t seen = 0; seen < 3 * N; ++batch) {
    const Batch b = packed.batch(batch);
    ASSERT_TRUE(b.starts.defined());
    for (int64_t r = 0; r < b.input_ids.size(0); ++r) {
      const std::vector<int64_t> ids = row_of(b, r);
      const auto labels = b.labels[r].contiguous(), starts = b.starts[r].contiguous();
      const int64_t* lab = labels.data_ptr<int64_t>();
      const int64_t* st = starts.data_ptr<int64_t>();
      for (int64_t t = 0; t < L; ++t) {
        if (st[t] != t || ids[static_cast<size_t>(t)] == pad)
          continue;  // not a conversation's start
        int64_t end = t + 1;
        while (end < L && st[end] == t) ++end;
        EXPECT_EQ(lab[t], -100) << "a conversation's first id is no target";
        std::vector<int64_t> conv(ids.begin() + t, ids.begin() + end);
        conv.insert(conv.end(), lab + t + 1, lab + end);  // ids, then the labels after the first
        if (seen < 3 * N) got[static_cast<size_t>(seen / N)].insert(conv);
        ++seen;
        real += end - t;
      }
      positions += L;
    }
  }
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const Batch b = padded.batch(epoch);  // N rows: the epoch
    std::multiset<std::vector<int64_t>> want;
    for (int64_t r = 0; r < N; ++r) {
      const std::vector<int64_t> ids = row_of(b, r);
      const int64_t n = std::find(ids.begin(), ids.end(), pad) - ids.begin();
      std::vector<int64_t> conv(ids.begin(), ids.begin() + n);
      const torch::Tensor lab = b.labels[r].contiguous();
      conv.insert(conv.end(), lab.data_ptr<int64_t>() + 1, lab.data_ptr<int64_t>() + n);
      want.insert(conv);
    }
    EXPECT_EQ(got[static_cast<size_t>(epoch)], want) << "epoch " << epoch;
  }
  // 21 conversations of 50-150 ids in rows of 160: most of a row is conversation.
  EXPECT_GT(static_cast<double>(real) / static_cast<double>(positions), 0.75);
  const BatchSampler fresh(data.tokens, "sft", 3, L, 5, 0, 1, data.index, o);
  for (int64_t i : {batch - 1, int64_t{0}}) {
    const Batch x = fresh.batch(i), y = packed.batch(i);
    EXPECT_TRUE(torch::equal(x.input_ids, y.input_ids) && torch::equal(x.labels, y.labels) &&
                torch::equal(x.starts, y.starts))
        << "batch " << i;
  }
}

// The chat loss of a model (evaluate_chat, what training's evaluations and minimind-eval
// report) against the loss formed here from tokenize --chat's rows: cross-entropy of each
// answer token given the ones before, summed over every labelled target of every
// conversation and divided by their count, in float64 from the model's logits. Within 1e-6
// relative (float32 logits, sums in another order).
TEST(ChatLoss, IsTheMeanOverTheAnswersTokens) {
  const ChatData data("");
  ModelConfig m;
  m.hidden_size = 32, m.num_hidden_layers = 2, m.num_attention_heads = 2;
  m.num_key_value_heads = 1, m.vocab_size = 6400, m.use_moe = true, m.num_experts = 4;
  m.num_experts_per_tok = 2;
  Config cfg;
  cfg.model = m;
  validate_and_resolve(cfg);
  torch::manual_seed(3);
  MiniMindForCausalLM model(cfg.model);
  init_weights(model);
  const int64_t L = 80;
  const EvalResult got = evaluate_chat(model, data.tokens, *data.index, L, 4);
  const SftEncoder enc(*data.tok);
  double sum = 0;
  int64_t count = 0;
  {
    torch::NoGradGuard no_grad;
    model->eval();
    for (const Conversation& c : data.conversations) {
      const SftRow row = enc.row(enc.encode(c), L);
      const torch::Tensor ids = torch::tensor(row.ids).view({1, L});
      const torch::Tensor logits = model(ids).logits[0].to(torch::kDouble);  // [L, V]
      const torch::Tensor logp = torch::log_softmax(logits, -1);
      for (int64_t t = 1; t < L; ++t) {
        if (row.labels[static_cast<size_t>(t)] == -100) continue;
        sum -= logp[t - 1][row.labels[static_cast<size_t>(t)]].item<double>();
        ++count;
      }
    }
  }
  ASSERT_GT(count, 100);
  EXPECT_EQ(got.tokens, count);
  EXPECT_EQ(got.documents, static_cast<int64_t>(data.conversations.size()));
  EXPECT_NEAR(got.loss, sum / count, 1e-6 * sum / count);
}
