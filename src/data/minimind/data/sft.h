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
#include "minimind/data/token_file.h"
#include "minimind/data/tokenizer.h"

namespace minimind {

// Calls on_conversation(c, line) for each usable record of a chat JSONL file, in file order;
// bad records (chat.h's parse_conversation says which) are skipped with a warning naming the
// line, or stop with a DataError under options.strict.
CorpusStats read_conversations(
    const std::string& path, const CorpusOptions& options,
    const std::function<void(Conversation&&, int64_t line)>& on_conversation,
    spdlog::logger& log = *spdlog::default_logger());

// What training rows of chat data are made from, beside a token file of chat data: the
// ids of the answer's markers, of each of MiniMind's system prompts as a system block, how
// many ids the template writes before a conversation without a system turn (MiniMind2's
// default block), and which conversations may take a system prompt. The token file holds two
// documents per conversation: its rendering, and the same with every empty think block
// removed (data.empty_think_ratio picks one per row). Written as JSON at
// token_file + ".sft" before the token file itself, so a token file never lacks its index.
struct SftIndex {
  std::vector<int32_t> open, close;
  std::vector<std::vector<int32_t>> system;  // kSystemPrompts' blocks, in order
  int64_t default_len = 0;
  std::vector<uint8_t> may_add_system;  // per conversation, 0 or 1
  void write(const std::string& token_file) const;
  static SftIndex read(const std::string& token_file);  // DataError naming the file
};

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

  // The index's parts that do not depend on the conversations (SftIndex).
  SftIndex index_base() const;
  // Conversation c into a chat token file: its two renderings (whole, and without empty
  // think blocks) as documents of `out`, whether it may take a system prompt into `index`.
  // Returns its ids (the whole rendering's).
  int64_t add_to(const Conversation& c, TokenFileWriter& out, SftIndex& index) const;

  // A row of `length` positions from a conversation's ids: cut there, right-padded with the
  // pad id, labelled by MiniMind's rule. length <= 0: the ids as they are, unpadded.
  SftRow row(const std::vector<int32_t>& ids, int64_t length) const;

 private:
  const Tokenizer& tok_;
  ChatTemplate template_;
  std::vector<int32_t> open_, close_, default_ids_;
};

// How chat rows are drawn (data.*): the augmentations' rates and the row length.
struct SftRowsOptions {
  double add_system_ratio = 0.2;
  double empty_think_ratio = 0.2;
  int64_t max_seq_len = 0;
  // data.sft_packing: conversations side by side in rows of max_seq_len (BatchSampler).
  bool packing = false;
};

// Conversation `conv`'s row for draw `draw` (a 64-bit hash: which augmentations apply), as
// MiniMind's SFTDataset makes it: a system prompt first with probability add_system_ratio
// (when the conversation may take one), its empty think blocks removed unless a draw below
// empty_think_ratio keeps them, cut at max_seq_len, padded with `pad`, labelled. ids and
// labels point to max_seq_len int64 each. Returns the row's unpadded length.
int64_t fill_sft_row(const TokenFile& tokens, const SftIndex& index, uint64_t conv, uint64_t draw,
                     const SftRowsOptions& o, int64_t* ids, int64_t* labels);

// The unpadded length of fill_sft_row's row for the same arguments, without making it.
int64_t sft_row_length(const TokenFile& tokens, const SftIndex& index, uint64_t conv, uint64_t draw,
                       const SftRowsOptions& o);

// Conversation `conv`'s evaluation row: its rendering, no augmentation (fill_sft_row's
// layout). Returns the unpadded length.
int64_t fill_sft_eval_row(const TokenFile& tokens, const SftIndex& index, uint64_t conv,
                          int64_t max_seq_len, int64_t* ids, int64_t* labels);

}  // namespace minimind
