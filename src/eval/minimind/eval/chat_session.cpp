#include "minimind/eval/chat_session.h"

#include "minimind/eval/text_stream.h"

namespace minimind {

ChatSession::ChatSession(MiniMindForCausalLM& model, const Tokenizer& tok, GenerateOptions options)
    : model_(model), tok_(tok), template_(tok.chat_template()), options_(options) {
  options_.eos_id = tok.specials().eos;
}

ChatReply ChatSession::answer(const Conversation& c,
                              const std::function<void(const std::string&)>& on_text) {
  const std::string prompt = template_.render(c, {/*generation_prompt=*/true, thinking_});
  std::vector<int64_t> ids;
  for (const int32_t id : tok_.encode(prompt)) ids.push_back(id);
  const int64_t room = model_->config().max_position_embeddings - static_cast<int64_t>(ids.size());
  if (room < 1)
    throw Error("the conversation fills the model's " +
                    std::to_string(model_->config().max_position_embeddings) +
                    " positions (model.max_position_embeddings): no room for an answer",
                "start a new conversation (/reset)");
  TextStream stream(tok_);
  ChatReply r;
  auto emit = [&](const std::string& piece) {
    r.text += piece;
    if (on_text && !piece.empty()) on_text(piece);
  };
  const std::vector<int64_t> out = generate(
      model_, ids, options_, [&](int64_t id) { emit(stream.add(static_cast<int32_t>(id))); });
  emit(stream.finish());
  r.tokens = static_cast<int64_t>(out.size());
  // generate stops at eos (not returned), max_new_tokens or the last position.
  r.ended = r.tokens < options_.max_new_tokens && r.tokens < room;
  return r;
}

ChatReply ChatSession::say(const std::string& user,
                           const std::function<void(const std::string&)>& on_text) {
  Conversation c = history_;
  c.messages.push_back({"user", user, {}, {}, {}, false});
  ChatReply r = answer(c, on_text);
  // The answer as the template reads it back: with thinking, what precedes </think> is the
  // reasoning (the generation prompt opened the block).
  c.messages.push_back({"assistant", r.text, {}, {}, {}, false});
  history_ = std::move(c);
  return r;
}

}  // namespace minimind
