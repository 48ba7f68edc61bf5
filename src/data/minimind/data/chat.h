// MiniMind's chat data (supervised fine-tuning, SFT): one conversation per JSONL record,
// rendered by the tokenizer's chat template as transformers' apply_chat_template renders it,
// and labelled by MiniMind's rule. Sources: MiniMind's dataset/lm_dataset.py (SFTDataset,
// pre_processing_chat, post_processing_chat) and model/tokenizer_config.json; the rules in
// our words in docs/fine-tuning.md.
//
// Templates are not interpreted: a chat_template is recognised by its exact text as one of
// those this file renders natively (MiniMind-3's, MiniMind2's), and any other text is
// refused, never rendered some other way.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace minimind {

// One turn as MiniMind's SFT data holds it. tools and tool_calls are JSON strings in the
// files (or already lists); they are parsed here.
struct ChatMessage {
  std::string role;     // system | user | assistant | tool
  std::string content;  // "" when absent or null
  std::optional<std::string> reasoning_content;
  nlohmann::ordered_json tool_calls;  // assistant: the calls, a list (null: none)
  nlohmann::ordered_json tools;       // system: the tools offered, a list (null: none)
  bool names_tools = false;           // the turn has a non-empty "tools" field
};

struct Conversation {
  std::vector<ChatMessage> messages;
};

// Parses one JSONL record {"conversations": [...]} into `out`. Returns why the record cannot
// be used ("" when it can): not a JSON object, no "conversations" list, an empty one, a turn
// that is not an object, an unknown role, a field of the wrong type, tools or tool_calls that
// are not JSON lists, a tool call without a string name or without arguments.
std::string parse_conversation(std::string_view line, Conversation& out);

// What a rendering adds at the end.
struct ChatPrompt {
  bool generation_prompt = false;  // the assistant's header, to generate its answer
  bool thinking = false;           // the answer starts inside a think block
};

class ChatTemplate {
 public:
  enum class Kind { minimind3, minimind2 };

  // The template of `text` (a chat_template field); TokenizerError naming the field and
  // `source` for a text this tool does not render.
  static ChatTemplate identify(const std::string& text, const std::string& source);
  // MiniMind-3's template (the tool's own tokenizers carry it).
  static ChatTemplate minimind3() { return ChatTemplate(Kind::minimind3); }

  Kind kind() const { return kind_; }
  const char* name() const;  // "MiniMind-3", "MiniMind2"
  // A chat_template text of our own writing that renders as this template (MiniMind-3 only:
  // the text files get from a tokenizer without one); identify() recognises it.
  const std::string& jinja() const;

  // The text apply_chat_template(messages, tools=<the system turn's tools>, tokenize=False,
  // add_generation_prompt=...) gives with this template.
  std::string render(const Conversation& c, const ChatPrompt& prompt = {}) const;
  // What the template writes first for a conversation without a system turn (and without
  // tools): "" for MiniMind-3, MiniMind2's default system block.
  std::string default_system_block() const;

 private:
  explicit ChatTemplate(Kind kind) : kind_(kind) {}
  Kind kind_;
};

// A system block as both templates write one: <|im_start|>system\n{prompt}<|im_end|>\n.
std::string system_block(const std::string& prompt);

// MiniMind's augmentations (pre_processing_chat, post_processing_chat):
// - a system prompt from kSystemPrompts put first, with probability data.add_system_ratio,
//   for a conversation whose first turn is not a system turn and none of whose turns names
//   tools (may_add_system_prompt);
// - every empty think block removed from the rendered text, unless a draw below
//   data.empty_think_ratio keeps them.
extern const std::array<const char*, 10> kSystemPrompts;
bool may_add_system_prompt(const Conversation& c);
constexpr const char* kEmptyThink = "<think>\n\n</think>\n\n";
std::string without_empty_think(std::string text);

// Labels by MiniMind's rule (SFTDataset.generate_labels) for the ids of one row: from just
// after each `open` sequence (the ids of "<|im_start|>assistant\n") up to and including the
// next `close` sequence (the ids of "<|im_end|>\n"), or to the row's end when there is none,
// each position labelled with its own id (the model shifts); every other position -100.
// Positions at or past max_length stay -100.
std::vector<int64_t> sft_labels(const std::vector<int64_t>& ids, const std::vector<int32_t>& open,
                                const std::vector<int32_t>& close, int64_t max_length);

// x as Python's json.dumps(x, ensure_ascii=False) writes it (the templates' tojson filter):
// ", " and ": " between items, keys in their order, non-ASCII as it is, floats as Python's
// repr.
std::string python_json(const nlohmann::ordered_json& x);

}  // namespace minimind
