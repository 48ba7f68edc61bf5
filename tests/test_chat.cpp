// Chat data: records refused with their reason, the templates' text on hand-written
// conversations, tojson as Python writes it, MiniMind's augmentations and label rule, and a
// sentencepiece model reading its special tokens in text. (Whole corpora against Jinja, the
// Rust library and a Python label rule: tests/chat_exact.sh.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "minimind/data/chat.h"
#include "minimind/data/sft.h"
#include "minimind/data/tokenizer.h"
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
