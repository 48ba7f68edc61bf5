#include "minimind/data/sft.h"

namespace minimind {

CorpusStats read_conversations(const std::string& path, const CorpusOptions& options,
                               const std::function<void(Conversation&&, int64_t)>& on_conversation,
                               spdlog::logger& log) {
  Conversation c;
  auto take = [&](std::string_view line, int64_t n) {
    std::string why = parse_conversation(line, c);
    if (why.empty()) on_conversation(std::move(c), n);
    return why;
  };
  return read_records(path, options, take,
                      "one {\"conversations\": [{\"role\": ..., \"content\": ...}, ...]} object "
                      "per line",
                      log);
}

SftEncoder::SftEncoder(const Tokenizer& tok)
    : tok_(tok),
      template_(tok.chat_template()),
      open_(tok.encode("<|im_start|>assistant\n")),
      close_(tok.encode("<|im_end|>\n")) {}

std::vector<int32_t> SftEncoder::encode(const Conversation& c) const {
  return tok_.encode(template_.render(c));
}

SftRow SftEncoder::row(const std::vector<int32_t>& ids, int64_t length) const {
  SftRow r;
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t L = length > 0 ? length : n;
  r.length = std::min(n, L);
  r.ids.assign(ids.begin(), ids.begin() + r.length);
  r.ids.resize(static_cast<size_t>(L), tok_.specials().pad);
  r.labels = sft_labels(r.ids, open_, close_, L);
  return r;
}

}  // namespace minimind
