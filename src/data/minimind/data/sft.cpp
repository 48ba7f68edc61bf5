#include "minimind/data/sft.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "minimind/util/atomic_file.h"
#include "minimind/util/input_file.h"
#include "minimind/util/mix64.h"

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
      close_(tok.encode("<|im_end|>\n")),
      default_ids_(tok.encode(template_.default_system_block())) {}

int64_t SftEncoder::add_to(const Conversation& c, TokenFileWriter& out, SftIndex& index) const {
  const std::string text = template_.render(c);
  const std::vector<int32_t> whole = tok_.encode(text);
  const std::vector<int32_t> thin = tok_.encode(without_empty_think(text));
  out.add_document(whole);
  out.add_document(thin);
  // A prompt replaces the template's default block: both renderings must start with it.
  auto starts_with_default = [&](const std::vector<int32_t>& ids) {
    return ids.size() >= default_ids_.size() &&
           std::equal(default_ids_.begin(), default_ids_.end(), ids.begin());
  };
  index.may_add_system.push_back(may_add_system_prompt(c) && starts_with_default(whole) &&
                                 starts_with_default(thin));
  return static_cast<int64_t>(whole.size());
}

std::vector<int32_t> SftEncoder::encode(const Conversation& c) const {
  return tok_.encode(template_.render(c));
}

SftIndex SftEncoder::index_base() const {
  SftIndex x;
  x.open = open_, x.close = close_;
  for (const char* prompt : kSystemPrompts) x.system.push_back(tok_.encode(system_block(prompt)));
  x.default_len = static_cast<int64_t>(default_ids_.size());
  return x;
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

namespace {

std::string index_path(const std::string& token_file) {
  return token_file + ".sft";
}

// Uniform in [0, 1) from 53 bits of a hash.
double unit(uint64_t h) {
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

// ids [0, L) <- the ids `parts` hold, one after the other, cut at L; padded with `pad`;
// labelled by the rule. Returns the unpadded length.
int64_t fill_row(const TokenFile& tokens, const SftIndex& index, const std::vector<int32_t>* prefix,
                 uint64_t doc, uint64_t skip, int64_t L, int64_t* ids, int64_t* labels) {
  int64_t n = 0;
  if (prefix)
    for (const int32_t id : *prefix) {
      if (n == L) break;
      ids[n++] = id;
    }
  const uint64_t len = tokens.doc_length(doc) - std::min(skip, tokens.doc_length(doc));
  const auto take = static_cast<uint64_t>(std::min<int64_t>(L - n, static_cast<int64_t>(len)));
  tokens.copy(tokens.doc_start(doc) + skip, take, ids + n);
  n += static_cast<int64_t>(take);
  std::fill(ids + n, ids + L, tokens.pad_id());
  const std::vector<int64_t> row(ids, ids + L);
  const std::vector<int64_t> l = sft_labels(row, index.open, index.close, L);
  std::copy(l.begin(), l.end(), labels);
  return n;
}

}  // namespace

void SftIndex::write(const std::string& token_file) const {
  std::string flags(may_add_system.size(), '0');
  for (size_t i = 0; i < flags.size(); ++i) flags[i] = may_add_system[i] ? '1' : '0';
  const nlohmann::json j{{"open", open},
                         {"close", close},
                         {"system", system},
                         {"default_len", default_len},
                         {"may_add_system", flags}};
  write_file_atomic(index_path(token_file), j.dump() + "\n");
}

SftIndex SftIndex::read(const std::string& token_file) {
  const std::string path = index_path(token_file);
  const std::string text =
      open_input<DataError>(path, "chat data index", "the .sft file beside a token file")
          .read_all();
  SftIndex x;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    x.open = j.at("open").get<std::vector<int32_t>>();
    x.close = j.at("close").get<std::vector<int32_t>>();
    x.system = j.at("system").get<std::vector<std::vector<int32_t>>>();
    x.default_len = j.at("default_len").get<int64_t>();
    for (const char c : j.at("may_add_system").get<std::string>())
      x.may_add_system.push_back(c == '1');
  } catch (const nlohmann::json::exception& e) {
    throw DataError("chat data index '" + path + "' is damaged (" + e.what() + ")",
                    "delete the cache directory's tokens/ folder: the next run prepares it again");
  }
  if (x.system.size() != kSystemPrompts.size() || x.open.empty() || x.close.empty())
    throw DataError("chat data index '" + path + "' is damaged (markers or system prompts missing)",
                    "delete the cache directory's tokens/ folder: the next run prepares it again");
  return x;
}

namespace {

// What draw `draw` makes of conversation conv's row: which of its two documents, and the
// system prompt that replaces the template's default block (nullptr: none).
struct RowPlan {
  uint64_t doc, skip = 0;
  const std::vector<int32_t>* prompt = nullptr;
};

RowPlan row_plan(const SftIndex& index, uint64_t conv, uint64_t draw, const SftRowsOptions& o) {
  const uint64_t d1 = mix64(draw), d2 = mix64(d1), d3 = mix64(d2);
  const bool system = index.may_add_system.at(conv) && unit(d1) < o.add_system_ratio;
  // MiniMind removes the empty think blocks when its draw is above the ratio.
  const bool drop_think = unit(d3) > o.empty_think_ratio;
  RowPlan p{2 * conv + (drop_think ? 1 : 0)};
  if (system) {
    // The prompt's block in place of the template's default one: the rendering after that
    // block is the same ids (both blocks end in <|im_end|>\n before an <|im_start|>).
    p.prompt = &index.system[d2 % index.system.size()];
    p.skip = static_cast<uint64_t>(index.default_len);
  }
  return p;
}

}  // namespace

int64_t fill_sft_row(const TokenFile& tokens, const SftIndex& index, uint64_t conv, uint64_t draw,
                     const SftRowsOptions& o, int64_t* ids, int64_t* labels) {
  const RowPlan p = row_plan(index, conv, draw, o);
  return fill_row(tokens, index, p.prompt, p.doc, p.skip, o.max_seq_len, ids, labels);
}

int64_t sft_row_length(const TokenFile& tokens, const SftIndex& index, uint64_t conv, uint64_t draw,
                       const SftRowsOptions& o) {
  const RowPlan p = row_plan(index, conv, draw, o);
  const uint64_t len = tokens.doc_length(p.doc);
  const auto n =
      static_cast<int64_t>((p.prompt ? p.prompt->size() : 0) + len - std::min(p.skip, len));
  return std::min(n, o.max_seq_len);
}

int64_t fill_sft_eval_row(const TokenFile& tokens, const SftIndex& index, uint64_t conv,
                          int64_t max_seq_len, int64_t* ids, int64_t* labels) {
  return fill_row(tokens, index, nullptr, 2 * conv, 0, max_seq_len, ids, labels);
}

}  // namespace minimind
