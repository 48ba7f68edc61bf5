#include "minimind/export/hf_tokenizer.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

namespace minimind {
namespace {

using Json = nlohmann::ordered_json;

// The UTF-8 characters of s, as byte offsets (merges split pieces between characters).
std::vector<size_t> char_starts(const std::string& s) {
  std::vector<size_t> at;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) at.push_back(i);
  return at;
}

}  // namespace

std::string hf_tokenizer_json(const Tokenizer& tok) {
  const int32_t V = tok.vocab_size();
  Json vocab = Json::object();
  std::map<std::string, int32_t> id_of;
  Json added = Json::array();
  for (int32_t id = 0; id < V; ++id) {
    const std::string piece = tok.piece(id);
    vocab[piece] = id;
    id_of[piece] = id;
    const PieceType type = tok.piece_type(id);
    if (type == PieceType::control || type == PieceType::unknown || type == PieceType::user_defined)
      added.push_back({{"id", id},
                       {"content", piece},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", type != PieceType::user_defined}});
  }
  // Merges: every split of a normal piece into two pieces of the vocabulary, the merges
  // that make a higher-scoring (earlier) piece first, as sentencepiece applies them.
  std::vector<std::tuple<int32_t, int32_t, int32_t, std::string, std::string>> merges;
  for (int32_t id = 0; id < V; ++id) {
    if (tok.piece_type(id) != PieceType::normal) continue;
    const std::string piece = tok.piece(id);
    const std::vector<size_t> at = char_starts(piece);
    for (size_t c = 1; c < at.size(); ++c) {
      const std::string l = piece.substr(0, at[c]), r = piece.substr(at[c]);
      const auto li = id_of.find(l), ri = id_of.find(r);
      if (li == id_of.end() || ri == id_of.end()) continue;
      if (tok.piece_type(li->second) != PieceType::normal ||
          tok.piece_type(ri->second) != PieceType::normal)
        continue;
      merges.emplace_back(id, li->second, ri->second, l, r);
    }
  }
  std::sort(merges.begin(), merges.end(), [&](const auto& a, const auto& b) {
    const float sa = tok.score(std::get<0>(a)), sb = tok.score(std::get<0>(b));
    if (sa != sb) return sa > sb;
    return std::tie(std::get<0>(a), std::get<1>(a), std::get<2>(a)) <
           std::tie(std::get<0>(b), std::get<1>(b), std::get<2>(b));
  });
  Json merge_list = Json::array();
  for (const auto& m : merges) merge_list.push_back(Json::array({std::get<3>(m), std::get<4>(m)}));

  const std::string bos = tok.piece(tok.specials().bos);
  Json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  // Spaces become "▁" and a word starts at each one; no "▁" is put before the text, as the
  // sentencepiece model adds no dummy prefix.
  j["pre_tokenizer"] = {{"type", "Metaspace"},
                        {"replacement", "\xE2\x96\x81"},
                        {"prepend_scheme", "never"},
                        {"split", true}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", Json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", Json::array({{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                            {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
                            {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
      {"special_tokens", {{bos, {{"id", bos}, {"ids", {tok.specials().bos}}, {"tokens", {bos}}}}}}};
  j["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       Json::array(
           {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
            {{"type", "ByteFallback"}},
            {{"type", "Fuse"}}})}};
  const std::string unk = tok.unknown_id() >= 0 ? tok.piece(tok.unknown_id()) : "<unk>";
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", unk},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", true},
                {"byte_fallback", true},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merge_list}};
  return j.dump(1) + "\n";
}

std::string hf_tokenizer_config(const Tokenizer& tok, int64_t model_max_length) {
  Json c;
  c["tokenizer_class"] = "PreTrainedTokenizerFast";
  c["bos_token"] = tok.piece(tok.specials().bos);
  c["eos_token"] = tok.piece(tok.specials().eos);
  c["pad_token"] = tok.piece(tok.specials().pad);
  if (tok.unknown_id() >= 0) c["unk_token"] = tok.piece(tok.unknown_id());
  // Ours adds [bos] in its post-processor; a tokenizer.json taken as it is (MiniMind's)
  // adds none, and MiniMind's scripts put [bos] in themselves.
  c["add_bos_token"] = !tok.is_hf_json();
  c["add_eos_token"] = false;
  c["clean_up_tokenization_spaces"] = false;
  c["model_max_length"] = model_max_length;
  // The chat template, for apply_chat_template: the one a tokenizer.json came with, or
  // MiniMind-3's in our words for our sentencepiece models.
  if (const std::string chat = tok.chat_template_for_files(); !chat.empty())
    c["chat_template"] = chat;
  return c.dump(2) + "\n";
}

}  // namespace minimind
