#include "minimind/data/byte_level_bpe.h"

#include <unicode/regex.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>

#include "minimind/error.h"

namespace minimind {
namespace {

// GPT-2's byte alphabet: the printable bytes stand for themselves, the others (controls,
// space, 127-160, 173) for the code points 256, 257, ... in byte order.
const std::array<char32_t, 256>& byte_to_char() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// The next code point of valid UTF-8 at s[i] and its length, or length 0 at invalid bytes;
// `bad` is then the length of the maximal ill-formed subpart (Unicode's recommended unit
// for one U+FFFD, which Rust's from_utf8_lossy follows).
char32_t next_code_point(std::string_view s, size_t i, size_t& len, size_t& bad) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  len = 0, bad = 1;
  if (b0 < 0x80) {
    len = 1;
    return b0;
  }
  int need;
  char32_t c;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, c = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, c = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, c = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char b = byte(i + k);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
    c = (c << 6) | (b & 0x3F);
    bad = static_cast<size_t>(k) + 1;
  }
  len = static_cast<size_t>(need) + 1;
  return c;
}

std::string lossy_utf8(std::string_view bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    size_t len, bad;
    const char32_t c = next_code_point(bytes, i, len, bad);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      i += bad;
    } else {
      append_utf8(out, c);
      i += len;
    }
  }
  return out;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

[[noreturn]] void refuse(const std::string& source, const std::string& field,
                         const std::string& what) {
  throw TokenizerError(source + ": " + field + " " + what,
                       "this tool reads byte-level BPE tokenizer.json files (GPT-2's, "
                       "MiniMind's): model BPE, pre_tokenizer and decoder ByteLevel, no "
                       "normalizer, no post-processor that adds ids (docs/data.md)");
}

bool null_or(const nlohmann::json& j, const char* key, const nlohmann::json& allowed) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() || *it == allowed;
}

}  // namespace

// Ids beyond this are not a vocabulary but a damaged file (and would overflow int32 sums).
constexpr int64_t kMaxTokens = int64_t{1} << 24;

struct ByteLevelBpe::Regex {
  std::unique_ptr<icu::RegexPattern> pattern;
};

std::shared_ptr<const ByteLevelBpe> ByteLevelBpe::from_json(const std::string& text,
                                                            const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw TokenizerError(source + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  // A field of another JSON type than the format's (a number where a string belongs).
  try {
    return read(j, source);
  } catch (const nlohmann::json::exception& e) {
    throw TokenizerError(source + ": not a tokenizer.json of the expected shape (" +
                         std::string(e.what()) + ")");
  }
}

std::shared_ptr<const ByteLevelBpe> ByteLevelBpe::read(const nlohmann::json& j,
                                                       const std::string& source) {
  if (!j.is_object() || !j.contains("model")) refuse(source, "model", "is missing");
  const nlohmann::json& model = j.at("model");
  if (model.value("type", std::string()) != "BPE")
    refuse(source, "model.type", "is " + model.value("type", std::string("missing")) + ", not BPE");
  if (!null_or(model, "dropout", 0.0)) refuse(source, "model.dropout", "is set (random merges)");
  if (!null_or(model, "unk_token", nullptr)) refuse(source, "model.unk_token", "is set");
  if (!null_or(model, "continuing_subword_prefix", "") || !null_or(model, "end_of_word_suffix", ""))
    refuse(source, "model.continuing_subword_prefix/end_of_word_suffix", "is set");
  if (!null_or(model, "byte_fallback", false)) refuse(source, "model.byte_fallback", "is true");
  if (!null_or(model, "ignore_merges", false)) refuse(source, "model.ignore_merges", "is true");
  if (!null_or(j, "normalizer", nullptr)) refuse(source, "normalizer", "is set");
  if (!null_or(j, "truncation", nullptr)) refuse(source, "truncation", "is set");
  if (!null_or(j, "padding", nullptr)) refuse(source, "padding", "is set");
  const nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
  if (!pre.is_object() || pre.value("type", std::string()) != "ByteLevel")
    refuse(source, "pre_tokenizer", "is not a single ByteLevel pre-tokenizer");
  if (pre.value("add_prefix_space", false))
    refuse(source, "pre_tokenizer.add_prefix_space", "is true");
  if (!pre.value("use_regex", true)) refuse(source, "pre_tokenizer.use_regex", "is false");
  const nlohmann::json dec = j.value("decoder", nlohmann::json());
  if (!dec.is_object() || dec.value("type", std::string()) != "ByteLevel")
    refuse(source, "decoder", "is not ByteLevel");
  const nlohmann::json post = j.value("post_processor", nlohmann::json());
  if (!post.is_null() && post.value("type", std::string()) != "ByteLevel")
    refuse(source, "post_processor",
           "is " + post.value("type", std::string("?")) + " (it adds ids to every text)");

  std::shared_ptr<ByteLevelBpe> t(new ByteLevelBpe());
  const nlohmann::json vocab = model.value("vocab", nlohmann::json());
  if (!vocab.is_object() || vocab.empty()) refuse(source, "model.vocab", "is missing or empty");
  std::map<int32_t, std::pair<std::string, uint8_t>> by_id;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= kMaxTokens)
      refuse(source, "model.vocab[\"" + it.key() + "\"]", "is not an id (0 to 2^24 - 1)");
    const auto [at, fresh] = by_id.emplace(it.value().get<int32_t>(), std::make_pair(it.key(), 0));
    if (!fresh)
      refuse(source, "model.vocab[\"" + it.key() + "\"]",
             "has id " + std::to_string(at->first) + ", which \"" + at->second.first +
                 "\" has too (duplicate id)");
  }
  const int32_t model_size = by_id.empty() ? 0 : by_id.rbegin()->first + 1;
  if (static_cast<size_t>(model_size) != by_id.size())
    refuse(source, "model.vocab",
           "leaves ids unused (" + std::to_string(by_id.size()) + " tokens, ids up to " +
               std::to_string(model_size - 1) + ")");
  // Added tokens take their ids as the Rust library gives them when it loads the file
  // (AddedVocabulary::add_tokens): a text already in the vocabulary, or added before, keeps
  // that id (the file's id for it names nothing then); any other takes the next id after the
  // vocabulary and the added tokens so far. The ids a file states are that sequence in every
  // file the library writes.
  std::unordered_map<std::string, int32_t> id_of_text;
  for (const auto& [id, entry] : by_id) id_of_text.emplace(entry.first, id);
  int32_t max_added = -1;
  for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
    if (!a.is_object()) refuse(source, "added_tokens", "holds an entry that is not an object");
    const nlohmann::json content_json = a.value("content", nlohmann::json());
    const nlohmann::json id_json = a.value("id", nlohmann::json());
    if (!content_json.is_string() || content_json.get<std::string>().empty() ||
        !id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() >= kMaxTokens)
      refuse(source, "added_tokens", "holds an entry without content or id (0 to 2^24 - 1)");
    const std::string content = content_json.get<std::string>();
    const int64_t file_id = id_json.get<int64_t>();
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      if (a.value(flag, false))
        refuse(source, "added_tokens[" + std::to_string(file_id) + "]." + flag, "is true");
    const auto known = id_of_text.find(content);
    const bool again = known != id_of_text.end() && by_id.at(known->second).second != 0;
    int32_t id = 0;
    if (known != id_of_text.end()) {
      id = known->second;
    } else {
      id = max_added >= model_size ? max_added + 1 : model_size;
      if (id >= kMaxTokens) refuse(source, "added_tokens", "gives more than 2^24 ids");
      id_of_text.emplace(content, id);
      by_id[id] = {content, 0};
    }
    max_added = std::max(max_added, id);
    if (again) continue;  // the first entry for a text decides its kind, as in the library
    by_id[id].second = static_cast<uint8_t>(a.value("special", false) ? 2 : 1);
    // Absent, "normalized" is what the Rust library's AddedToken::from gives: !special.
    const bool normalized = a.value("normalized", !a.value("special", false));
    t->added_[normalized].emplace_back(content, id);
  }
  const int32_t size = by_id.rbegin()->first + 1;
  t->tokens_.resize(static_cast<size_t>(size));
  t->added_kind_.resize(static_cast<size_t>(size));
  for (const auto& [id, entry] : by_id) {
    t->tokens_[static_cast<size_t>(id)] = entry.first;
    t->added_kind_[static_cast<size_t>(id)] = entry.second;
    t->ids_.emplace(entry.first, id);
  }
  for (int pass = 0; pass < 2; ++pass) {
    auto& added = t->added_[pass];
    std::stable_sort(added.begin(), added.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    for (const auto& a : added)
      t->added_starts_with_[pass][static_cast<unsigned char>(a.first[0])] = true;
  }
  static std::atomic<uint64_t> instances{0};
  t->instance_ = ++instances;

  for (int b = 0; b < 256; ++b) {
    std::string c;
    append_utf8(c, byte_to_char()[static_cast<size_t>(b)]);
    const int32_t id = t->id_of(c);
    if (id < 0) refuse(source, "model.vocab", "lacks the byte-alphabet token '" + c + "'");
    t->byte_id_[b] = id;
  }

  const nlohmann::json merges = model.value("merges", nlohmann::json::array());
  for (size_t r = 0; r < merges.size(); ++r) {
    const nlohmann::json& m = merges[r];
    std::string left, right;
    if (m.is_string()) {  // "a b" (older files)
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos)
        refuse(source, "model.merges[" + std::to_string(r) + "]", "is not 'a b'");
      left = s.substr(0, space), right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    } else {
      refuse(source, "model.merges[" + std::to_string(r) + "]", "is neither 'a b' nor a pair");
    }
    const int32_t a = t->id_of(left), b = t->id_of(right), ab = t->id_of(left + right);
    if (a < 0 || b < 0 || ab < 0)
      refuse(source, "model.merges[" + std::to_string(r) + "]",
             "names a token the vocabulary lacks ('" + left + "' '" + right + "')");
    t->merge_of_.emplace(pair_key(a, b), std::make_pair(static_cast<int32_t>(r), ab));
    t->merges_.emplace_back(left, right);
  }

  auto regex = std::make_shared<Regex>();
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse{};
  regex->pattern.reset(icu::RegexPattern::compile(
      icu::UnicodeString::fromUTF8(
          R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"),
      0, parse, status));
  if (U_FAILURE(status))
    throw TokenizerError(std::string("ICU cannot compile GPT-2's pre-tokenizer regex: ") +
                         u_errorName(status));
  t->regex_ = regex;
  return t;
}

int32_t ByteLevelBpe::id_of(const std::string& token) const {
  const auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

void ByteLevelBpe::encode_piece(const std::string& bytes, std::vector<int32_t>& out) const {
  // Symbols in a linked list; candidate merges in a heap by (rank, position), so the pair of
  // lowest rank, the leftmost of equals, is merged first, in O(n log n) for a long piece (a
  // run of a million spaces is one piece). A candidate whose symbols have changed since it
  // was pushed is skipped when popped.
  struct Symbol {
    int32_t id, prev, next;  // prev/next: -1 at the ends
    bool alive;
  };
  const auto n = static_cast<int32_t>(bytes.size());
  std::vector<Symbol> sym(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    sym[static_cast<size_t>(i)] = {
        byte_id_[static_cast<unsigned char>(bytes[static_cast<size_t>(i)])], i - 1,
        i + 1 < n ? i + 1 : -1, true};
  using Candidate = std::pair<int32_t, int32_t>;  // (rank, position of the left symbol)
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto rank_at = [&](int32_t i) -> const std::pair<int32_t, int32_t>* {
    const Symbol& s = sym[static_cast<size_t>(i)];
    if (s.next < 0) return nullptr;
    const auto it = merge_of_.find(pair_key(s.id, sym[static_cast<size_t>(s.next)].id));
    return it == merge_of_.end() ? nullptr : &it->second;
  };
  auto push = [&](int32_t i) {
    if (i < 0) return;
    if (const auto* m = rank_at(i)) heap.emplace(m->first, i);
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto [rank, i] = heap.top();
    heap.pop();
    Symbol& s = sym[static_cast<size_t>(i)];
    const auto* m = s.alive ? rank_at(i) : nullptr;
    if (m == nullptr || m->first != rank) continue;  // stale
    Symbol& right = sym[static_cast<size_t>(s.next)];
    right.alive = false;
    s.id = m->second;
    s.next = right.next;
    if (s.next >= 0) sym[static_cast<size_t>(s.next)].prev = i;
    push(s.prev);
    push(i);
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = sym[static_cast<size_t>(i)].next)
    out.push_back(sym[static_cast<size_t>(i)].id);
}

void ByteLevelBpe::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  // Invalid UTF-8 becomes U+FFFD here (ICU works on UTF-16), as the corpus reader does.
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(
      icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> m(regex_->pattern->matcher(u, status));
  if (U_FAILURE(status)) throw TokenizerError(std::string("ICU regex: ") + u_errorName(status));
  // Words recur: each thread keeps the ids of the pieces it has merged (as the Rust library
  // keeps a cache), for this tokenizer only, and starts afresh when it holds 2^16 of them.
  struct PieceCache {
    uint64_t owner = 0;
    std::unordered_map<std::string, std::vector<int32_t>> ids;
  };
  thread_local PieceCache cache;
  if (cache.owner != instance_ || cache.ids.size() >= (size_t{1} << 16)) {
    cache.ids.clear();
    cache.owner = instance_;
  }
  int32_t done = 0;
  std::string piece;
  auto emit = [&](int32_t from, int32_t to) {
    piece.clear();
    u.tempSubStringBetween(from, to).toUTF8String(piece);
    auto [it, fresh] = cache.ids.try_emplace(piece);
    if (fresh) encode_piece(piece, it->second);
    out.insert(out.end(), it->second.begin(), it->second.end());
  };
  while (m->find(status)) {
    const int32_t start = m->start(status), end = m->end(status);
    if (start > done) emit(done, start);  // text no alternative matched (isolated as well)
    if (end > start) emit(start, end);
    done = end;
  }
  if (done < u.length()) emit(done, u.length());
}

std::vector<int32_t> ByteLevelBpe::encode(std::string_view text) const {
  std::vector<int32_t> out;
  split_added(text, 0, out);
  return out;
}

// Finds pass `pass`'s added tokens in text (the leftmost match, the longest at its
// position); the text between goes to the next pass, after the last to the regex and BPE.
void ByteLevelBpe::split_added(std::string_view text, int pass, std::vector<int32_t>& out) const {
  auto rest = [&](std::string_view between) {
    if (pass == 0)
      split_added(between, 1, out);
    else
      encode_text(between, out);
  };
  size_t from = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t found = -1;
    size_t length = 0;
    if (added_starts_with_[pass][static_cast<unsigned char>(text[i])])
      for (const auto& [content, id] : added_[pass])
        if (text.compare(i, content.size(), content) == 0) {
          found = id, length = content.size();
          break;
        }
    if (found < 0) {
      ++i;
      continue;
    }
    rest(text.substr(from, i - from));
    out.push_back(found);
    i += length;
    from = i;
  }
  rest(text.substr(from));
}

std::string ByteLevelBpe::decode(const std::vector<int32_t>& ids) const {
  static const std::unordered_map<char32_t, unsigned char> char_to_byte = [] {
    std::unordered_map<char32_t, unsigned char> m;
    for (int b = 0; b < 256; ++b)
      m[byte_to_char()[static_cast<size_t>(b)]] = static_cast<unsigned char>(b);
    return m;
  }();
  std::string bytes;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw TokenizerError("id " + std::to_string(id) + " is outside the vocabulary (0-" +
                           std::to_string(vocab_size() - 1) + ")");
    const std::string& t = tokens_[static_cast<size_t>(id)];
    // Every character maps back to its byte; a token with a character outside the
    // alphabet (an added token's text) keeps its own bytes, as the Rust library does.
    std::string mapped;
    bool all = true;
    for (size_t i = 0; i < t.size() && all;) {
      size_t len, bad;
      const char32_t c = next_code_point(t, i, len, bad);
      const auto it = len ? char_to_byte.find(c) : char_to_byte.end();
      if (it == char_to_byte.end())
        all = false;
      else
        mapped += static_cast<char>(it->second);
      i += len ? len : 1;
    }
    bytes += all ? mapped : t;
  }
  return lossy_utf8(bytes);
}

}  // namespace minimind
