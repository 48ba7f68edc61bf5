// Chat data as training rows, as MiniMind's SFTDataset makes them: a conversation rendered by
// the tokenizer's chat template (chat.h), tokenised with no special tokens added, cut at the
// row length, right-padded with the pad id, and labelled on the assistant's turns only.
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "minimind/data/chat.h"
#include "minimind/data/jsonl.h"
#include "minimind/data/tokenizer.h"

namespace minimind {

// Calls on_conversation(c, line) for each usable record of a chat JSONL file, in file order;
// bad records (chat.h's parse_conversation says which) are skipped with a warning naming the
// line, or stop with a DataError under options.strict.
CorpusStats read_conversations(
    const std::string& path, const CorpusOptions& options,
    const std::function<void(Conversation&&, int64_t line)>& on_conversation,
    spdlog::logger& log = *spdlog::default_logger());

// One training row: ids and labels of L positions each (-100 where no loss is taken; the
// model shifts), and how many of the ids are the conversation's (the rest is padding).
struct SftRow {
  std::vector<int64_t> ids, labels;
  int64_t length = 0;
};

class SftEncoder {
 public:
  // The tokenizer's template, and the ids MiniMind's rule finds an answer by: those of
  // "<|im_start|>assistant\n" (where one starts) and "<|im_end|>\n" (where it ends).
  explicit SftEncoder(const Tokenizer& tok);

  const ChatTemplate& chat_template() const { return template_; }
  const std::vector<int32_t>& answer_open() const { return open_; }
  const std::vector<int32_t>& answer_close() const { return close_; }

  // The ids of a rendered text (the template's text, perhaps augmented).
  std::vector<int32_t> encode(const std::string& text) const { return tok_.encode(text); }
  // The rendering of c with no augmentation, as ids.
  std::vector<int32_t> encode(const Conversation& c) const;

  // A row of `length` positions from a conversation's ids: cut there, right-padded with the
  // pad id, labelled by MiniMind's rule. length <= 0: the ids as they are, unpadded.
  SftRow row(const std::vector<int32_t>& ids, int64_t length) const;

 private:
  const Tokenizer& tok_;
  ChatTemplate template_;
  std::vector<int32_t> open_, close_;
};

}  // namespace minimind
