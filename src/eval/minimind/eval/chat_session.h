// Talking to a model (minimind-eval chat): each user turn is rendered with the conversation
// so far by the tokenizer's chat template, with the assistant's header as the generation
// prompt, and the answer is generated until <|im_end|> (the tokenizer's eos), as MiniMind's
// eval_llm.py does.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "minimind/data/chat.h"
#include "minimind/data/tokenizer.h"
#include "minimind/eval/generate.h"
#include "minimind/model/minimind_model.h"

namespace minimind {

struct ChatReply {
  std::string text;    // the answer as the model wrote it (with its reasoning when thinking)
  int64_t tokens = 0;  // generated, <|im_end|> not counted
  bool ended = false;  // the model closed its turn (<|im_end|>) before max_new_tokens
};

class ChatSession {
 public:
  // options: sampling as generate's; its eos_id is set to the tokenizer's.
  ChatSession(MiniMindForCausalLM& model, const Tokenizer& tok, GenerateOptions options);

  // The answer to `c`, whose last turn is the user's (or a tool's), streamed to on_text
  // piece by piece (whole UTF-8 characters). Throws Error when the conversation leaves no
  // room to answer in model.max_position_embeddings.
  ChatReply answer(const Conversation& c,
                   const std::function<void(const std::string&)>& on_text = {});
  // `user` said in this session's conversation: the answer, both kept for the next turn.
  ChatReply say(const std::string& user,
                const std::function<void(const std::string&)>& on_text = {});
  void reset() { history_.messages.clear(); }
  // Whether answers start inside a think block (MiniMind-3's open_thinking) or after an empty
  // one; off by default, as MiniMind's chat.
  void set_thinking(bool on) { thinking_ = on; }
  bool thinking() const { return thinking_; }
  const Conversation& history() const { return history_; }
  const ChatTemplate& chat_template() const { return template_; }

 private:
  MiniMindForCausalLM& model_;
  const Tokenizer& tok_;
  ChatTemplate template_;
  GenerateOptions options_;
  Conversation history_;
  bool thinking_ = false;
};

}  // namespace minimind
