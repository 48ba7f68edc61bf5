#include "minimind/data/tokenizer.h"

#include <dlfcn.h>

#include <array>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "minimind/config.h"  // program_dir
#include "minimind/data/spm_shim.h"
#include "minimind/util/input_file.h"

namespace minimind {
namespace {

// The functions of libminimind_spm.so, loaded once per process (see spm_shim.h).
struct SpmApi {
  decltype(&mm_spm_train) train;
  decltype(&mm_spm_load) load;
  decltype(&mm_spm_unload) unload;
  decltype(&mm_spm_vocab_size) vocab_size;
  decltype(&mm_spm_id_to_piece) id_to_piece;
  decltype(&mm_spm_encode) encode;
  decltype(&mm_spm_decode) decode;
  decltype(&mm_spm_free) free;
};

const SpmApi& spm() {
  static const SpmApi api = [] {
    // Where the library may be: $MINIMIND_SPM_LIB, beside the program, an install's
    // lib/ directory, or the build tree this binary came from.
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("MINIMIND_SPM_LIB")) candidates.push_back(env);
    candidates.push_back(program_dir() + "/libminimind_spm.so");
    candidates.push_back(program_dir() + "/../lib/libminimind_spm.so");
    candidates.push_back(MINIMIND_SPM_BUILD_PATH);
    void* lib = nullptr;
    std::string errors;
    for (const auto& c : candidates) {
      lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (lib) break;
      errors += "\n  " + std::string(dlerror());
    }
    if (!lib)
      throw TokenizerError("cannot load libminimind_spm.so (the sentencepiece wrapper):" + errors +
                           "\nhint: rebuild with scripts/build.sh or set MINIMIND_SPM_LIB");
    auto sym = [&](const char* name) {
      void* p = dlsym(lib, name);
      if (!p) throw TokenizerError(std::string("libminimind_spm.so lacks ") + name);
      return p;
    };
    SpmApi a;
    a.train = reinterpret_cast<decltype(a.train)>(sym("mm_spm_train"));
    a.load = reinterpret_cast<decltype(a.load)>(sym("mm_spm_load"));
    a.unload = reinterpret_cast<decltype(a.unload)>(sym("mm_spm_unload"));
    a.vocab_size = reinterpret_cast<decltype(a.vocab_size)>(sym("mm_spm_vocab_size"));
    a.id_to_piece = reinterpret_cast<decltype(a.id_to_piece)>(sym("mm_spm_id_to_piece"));
    a.encode = reinterpret_cast<decltype(a.encode)>(sym("mm_spm_encode"));
    a.decode = reinterpret_cast<decltype(a.decode)>(sym("mm_spm_decode"));
    a.free = reinterpret_cast<decltype(a.free)>(sym("mm_spm_free"));
    return a;
  }();
  return api;
}

}  // namespace

struct Tokenizer::Handle {
  void* spm = nullptr;
  std::once_flag pieces_once;
  std::vector<PieceInfo> pieces;
  ~Handle() {
    if (spm) minimind::spm().unload(spm);
  }
};

namespace {

// What a tokenizer_config.json beside a tokenizer.json gives: the pad, bos and eos names (an
// entry is a string or an object with "content"; empty when it names none of them) and the
// chat template.
struct ConfigBeside {
  std::vector<std::string> special_names;
  std::string chat_template, path;
};
ConfigBeside config_beside(const std::filesystem::path& tokenizer_json) {
  const std::filesystem::path config = tokenizer_json.parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(config, ec))) return {};
  const std::string text =
      open_input<TokenizerError>(config.string(), "tokenizer config", "a JSON file").read_all();
  return {special_names_of_config(text, config.string()),
          chat_template_of_config(text, config.string()), config.string()};
}

}  // namespace

std::vector<std::string> special_names_of_config(const std::string& text,
                                                 const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw TokenizerError("'" + source + "' is not valid JSON (" + first_line(e.what()) + ")");
  }
  if (!j.is_object())
    throw TokenizerError("'" + source + "' holds JSON " + j.type_name() + ", not an object",
                         "a tokenizer_config.json is an object such as {\"eos_token\": "
                         "\"<|im_end|>\"}");
  // As transformers reads them: a token's name, an AddedToken object with its "content", or
  // null (none). Anything else is a mistake in the file, not a name to guess.
  std::vector<std::string> names;
  for (const char* key : {"pad_token", "bos_token", "eos_token"}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      names.emplace_back();
      continue;
    }
    const nlohmann::json& v = *it;
    if (v.is_string()) {
      names.push_back(v.get<std::string>());
    } else if (v.is_object() && v.contains("content") && v.at("content").is_string()) {
      names.push_back(v.at("content").get<std::string>());
    } else {
      throw TokenizerError(
          "'" + source + "': " + key + " is " +
              (v.is_object() ? std::string("an object without a string \"content\"")
                             : "JSON " + std::string(v.type_name()) + " (" + v.dump() + ")") +
              ", not a token's name",
          std::string("give the token's text, e.g. \"") + key + "\": \"<|im_end|>\", or null");
    }
  }
  return names;
}

std::string chat_template_of_config(const std::string& text, const std::string& source) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "";  // special_names_of_config names what is wrong
  const auto it = j.find("chat_template");
  if (it == j.end() || it->is_null()) return "";
  if (!it->is_string())
    throw TokenizerError(
        "'" + source + "': chat_template is JSON " + it->type_name() + ", not a template's text",
        "this tool renders one template per tokenizer: MiniMind's "
        "chat_template string");
  return it->get<std::string>();
}

std::string run_tokenizer_file(const std::string& run_dir) {
  for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
    const std::filesystem::path p = std::filesystem::path(run_dir) / name;
    if (std::filesystem::exists(p)) return p.string();
  }
  return {};
}

namespace {
// What a tokenizer file may be, for the errors of one that is neither.
const char* const kTokenizerKinds =
    "give a sentencepiece .model file or a Hugging Face tokenizer.json (a JSON object, such "
    "as MiniMind's model/tokenizer.json)";
}  // namespace

std::string run_tokenizer_name(const std::string& path) {
  InputFile in = open_input<TokenizerError>(path, "tokenizer", "a tokenizer file");
  char c = 0;
  while (in.read(&c, 1) == 1 && std::isspace(static_cast<unsigned char>(c))) {
  }
  return c == '{' ? "tokenizer.json" : "tokenizer.model";
}

Tokenizer Tokenizer::from_bytes(std::string model_bytes, const std::string& source,
                                const std::vector<std::string>& special_names) {
  Tokenizer t;
  // A sentencepiece model is protobuf (its first byte 0x0A); these are JSON that no
  // tokenizer.json reader takes, and would otherwise be reported as broken protobuf.
  if (model_bytes.rfind("\xEF\xBB\xBF", 0) == 0)
    throw TokenizerError("tokenizer '" + source +
                             "' begins with a UTF-8 byte-order mark: a tokenizer.json must "
                             "begin with '{' (Hugging Face's library refuses the mark as well)",
                         "save the file without the mark, e.g. sed -i '1s/^\\xEF\\xBB\\xBF//' "
                         "FILE");
  const size_t first = model_bytes.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (model_bytes[first] == '[' || model_bytes[first] == '"') &&
      nlohmann::json::accept(model_bytes))
    throw TokenizerError("tokenizer '" + source + "' holds a JSON " +
                             (model_bytes[first] == '[' ? "array" : "string") +
                             ", not a tokenizer.json (a JSON object with \"model\")",
                         kTokenizerKinds);
  if (first != std::string::npos && model_bytes[first] == '{') {
    t.bpe_ = ByteLevelBpe::from_json(model_bytes, source);
    // pad, bos, eos by name, at whatever ids the file gives them; MiniMind's name for a
    // role the names leave out (GPT-2's configs name no pad).
    const char* defaults[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    const char* roles[] = {"pad", "bos", "eos"};
    int32_t* ids[] = {&t.specials_.pad, &t.specials_.bos, &t.specials_.eos};
    for (size_t i = 0; i < 3; ++i) {
      const std::string name = i < special_names.size() && !special_names[i].empty()
                                   ? special_names[i]
                                   : std::string(defaults[i]);
      *ids[i] = t.bpe_->id_of(name);
      if (*ids[i] < 0)
        throw TokenizerError(
            "tokenizer '" + source + "': " + roles[i] + " token '" + name +
                "' is not in the vocabulary",
            "MiniMind's tokenizer.json has <|endoftext|>, <|im_start|>, <|im_end|> for pad, "
            "bos and eos; a tokenizer_config.json beside the file names others (pad_token, "
            "bos_token, eos_token)");
    }
    t.bytes_ = std::move(model_bytes);
    t.source_ = source;
    return t;
  }
  t.handle_ = std::make_shared<Handle>();
  char err[1024];
  if (spm().load(model_bytes.data(), model_bytes.size(), &t.handle_->spm, err, sizeof(err)) != 0)
    throw TokenizerError("'" + source + "' is not a sentencepiece model: " + err, kTokenizerKinds);
  t.bytes_ = std::move(model_bytes);
  t.source_ = source;
  return t;
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  // A device or FIFO would be read without end or block (/dev/zero, a pipe).
  std::string bytes =
      open_input<TokenizerError>(path, "tokenizer model", "a tokenizer file", kTokenizerKinds)
          .read_all();
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first == std::string::npos)
    throw TokenizerError("tokenizer '" + path + "' is empty", kTokenizerKinds);
  if (bytes[first] != '{') return from_bytes(std::move(bytes), path);
  ConfigBeside config = config_beside(path);
  Tokenizer t = from_bytes(std::move(bytes), path, config.special_names);
  t.chat_template_ = std::move(config.chat_template);
  t.chat_template_source_ = std::move(config.path);
  return t;
}

std::string Tokenizer::train(const std::vector<std::string_view>& texts, int32_t vocab_size) {
  // The trainer reads sentences without newlines; each line of a record is a sentence.
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
  for (std::string_view text : texts) {
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string_view::npos) end = text.size();
      if (end > start) {
        ptrs.push_back(text.data() + start);
        lens.push_back(end - start);
      }
      start = end + 1;
    }
  }
  // Everything that decides how text becomes ids is stored in the model itself:
  const std::vector<std::pair<std::string, std::string>> options = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      // MiniMind's ids: 0 pad <|endoftext|>, 1 bos <|im_start|>, 2 eos <|im_end|>.
      {"pad_id", "0"},
      {"pad_piece", "<|endoftext|>"},
      {"bos_id", "1"},
      {"bos_piece", "<|im_start|>"},
      {"eos_id", "2"},
      {"eos_piece", "<|im_end|>"},
      {"unk_id", "3"},
      {"unk_piece", "<unk>"},
      // Any UTF-8 text round-trips: characters outside the vocabulary become bytes.
      {"byte_fallback", "true"},
      // Newline is one piece of its own (like MiniMind's byte-level BPE keeps "\n"); no
      // normalisation, no whitespace folding, no dummy prefix: decode(encode(s)) == s.
      {"user_defined_symbols", "\n"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "false"},
      {"character_coverage", "0.9995"},
      {"max_sentence_length", "65536"},
      // The thread count is stored in the model; a fixed one keeps the .model bytes (and so
      // the cache keys) the same on every machine. BPE training here is single-threaded.
      {"num_threads", "1"},
      {"minloglevel", "2"},
  };
  std::vector<const char*> keys, values;
  for (const auto& [k, v] : options) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  char* model = nullptr;
  size_t model_len = 0;
  char err[2048];
  if (spm().train(ptrs.data(), lens.data(), ptrs.size(), keys.data(), values.data(), keys.size(),
                  &model, &model_len, err, sizeof(err)) != 0)
    throw TokenizerError(std::string("tokenizer training failed: ") + err);
  std::string out(model, model_len);
  spm().free(model);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  if (bpe_) return bpe_->encode(text);
  // sentencepiece never produces its control pieces from text: the texts of pad, bos and
  // eos are found here, and the text between them encoded.
  const std::array<int32_t, 3> specials{specials_.pad, specials_.bos, specials_.eos};
  std::array<std::string, 3> texts;
  for (size_t k = 0; k < 3; ++k) texts[k] = piece(specials[k]);
  std::vector<int32_t> out;
  auto encode_plain = [&](std::string_view part) {
    if (part.empty()) return;
    int32_t* ids = nullptr;
    size_t n = 0;
    char err[1024];
    if (spm().encode(handle_->spm, part.data(), part.size(), &ids, &n, err, sizeof(err)) != 0)
      throw TokenizerError(std::string("encode failed: ") + err);
    out.insert(out.end(), ids, ids + n);
    spm().free(ids);
  };
  size_t from = 0;
  while (true) {
    size_t at = std::string_view::npos, which = 0;
    for (size_t k = 0; k < 3; ++k) {
      const size_t found = texts[k].empty() ? std::string_view::npos : text.find(texts[k], from);
      if (found < at) at = found, which = k;
    }
    if (at == std::string_view::npos) break;
    encode_plain(text.substr(from, at - from));
    out.push_back(specials[which]);
    from = at + texts[which].size();
  }
  encode_plain(text.substr(from));
  return out;
}

std::vector<int32_t> Tokenizer::encode_document(std::string_view text) const {
  std::vector<int32_t> ids{specials_.bos};
  const std::vector<int32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.push_back(specials_.eos);
  return ids;
}

std::string Tokenizer::config_json() const {
  nlohmann::json j{{"pad_token", piece(specials_.pad)},
                   {"bos_token", piece(specials_.bos)},
                   {"eos_token", piece(specials_.eos)}};
  if (!chat_template_.empty()) j["chat_template"] = chat_template_;
  return j.dump(2) + "\n";
}

std::string Tokenizer::chat_template_for_files() const {
  if (bpe_) return chat_template_;
  const SpecialIds& s = specials();
  if (piece(s.bos) != "<|im_start|>" || piece(s.eos) != "<|im_end|>") return "";
  return ChatTemplate::minimind3().jinja();
}

ChatTemplate Tokenizer::chat_template() const {
  if (!bpe_) return ChatTemplate::minimind3();
  if (chat_template_.empty())
    throw TokenizerError("tokenizer '" + source_ +
                             "' has no chat template (no chat_template in a "
                             "tokenizer_config.json beside it)",
                         "put the tokenizer_config.json that came with the tokenizer beside it "
                         "(MiniMind's model/tokenizer_config.json)");
  return ChatTemplate::identify(chat_template_, chat_template_source_);
}

void Tokenizer::check_vocab_size(int64_t model_vocab_size) const {
  if (vocab_size() == model_vocab_size) return;
  throw TokenizerError("tokenizer '" + source_ + "' has " + std::to_string(vocab_size()) +
                           " pieces but model.vocab_size is " + std::to_string(model_vocab_size),
                       "set model.vocab_size to " + std::to_string(vocab_size()) +
                           ", or use the tokenizer the model was trained with (its run's "
                           "tokenizer.model)");
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  if (bpe_) return bpe_->decode(ids);
  char* text = nullptr;
  size_t n = 0;
  char err[1024];
  if (spm().decode(handle_->spm, ids.data(), ids.size(), &text, &n, err, sizeof(err)) != 0)
    throw TokenizerError(std::string("decode failed: ") + err);
  std::string out(text, n);
  spm().free(text);
  return out;
}

std::string Tokenizer::piece(int32_t id) const {
  if (bpe_) return bpe_->token(id);
  return spm().id_to_piece(handle_->spm, id);
}

float Tokenizer::score(int32_t id) const {
  if (bpe_) return 0.0f;  // merges have ranks, not scores
  return pieces().at(static_cast<size_t>(id)).score;
}

PieceType Tokenizer::piece_type(int32_t id) const {
  if (bpe_)
    return bpe_->is_special(id) ? PieceType::control
           : bpe_->is_added(id) ? PieceType::user_defined
                                : PieceType::normal;
  return pieces().at(static_cast<size_t>(id)).type;
}

int32_t Tokenizer::unknown_id() const {
  if (bpe_) return -1;  // byte-level: every text has ids
  const std::vector<PieceInfo>& p = pieces();
  for (size_t id = 0; id < p.size(); ++id)
    if (p[id].type == PieceType::unknown) return static_cast<int32_t>(id);
  return -1;
}

// The serialised model is a sentencepiece ModelProto; its pieces (field 1, repeated) each
// hold piece (1, string), score (2, float) and type (3, enum). Read here because Debian's
// sentencepiece installs no header for the proto and its processor API has no user-defined
// test. Only the wire types those fields use are needed to skip the others.
const std::vector<Tokenizer::PieceInfo>& Tokenizer::pieces() const {
  std::call_once(handle_->pieces_once, [&] {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes_.data());
    const unsigned char* const end = p + bytes_.size();
    auto varint = [&](const unsigned char*& q, const unsigned char* stop) {
      uint64_t v = 0;
      for (int shift = 0; q < stop && shift < 64; shift += 7) {
        const unsigned char b = *q++;
        v |= static_cast<uint64_t>(b & 0x7F) << shift;
        if (!(b & 0x80)) return v;
      }
      throw TokenizerError("tokenizer '" + source_ + "' is not a valid sentencepiece model");
    };
    auto skip = [&](const unsigned char*& q, const unsigned char* stop, uint64_t wire) {
      if (wire == 0)
        varint(q, stop);
      else if (wire == 1)
        q += 8;
      else if (wire == 2)
        q += varint(q, stop);
      else if (wire == 5)
        q += 4;
      else
        throw TokenizerError("tokenizer '" + source_ + "' is not a valid sentencepiece model");
      if (q > stop) throw TokenizerError("tokenizer '" + source_ + "' is truncated");
    };
    std::vector<PieceInfo>& out = handle_->pieces;
    while (p < end) {
      const uint64_t key = varint(p, end);
      if ((key >> 3) != 1 || (key & 7) != 2) {
        skip(p, end, key & 7);
        continue;
      }
      const uint64_t n = varint(p, end);
      if (n > static_cast<uint64_t>(end - p))
        throw TokenizerError("tokenizer '" + source_ + "' is truncated");
      const unsigned char* q = p;
      const unsigned char* const stop = p + n;
      PieceInfo info{0.0f, PieceType::normal};
      while (q < stop) {
        const uint64_t k = varint(q, stop);
        if (k == ((2 << 3) | 5) && stop - q >= 4) {
          std::memcpy(&info.score, q, 4);
          q += 4;
        } else if (k == ((3 << 3) | 0)) {
          info.type = static_cast<PieceType>(varint(q, stop));
        } else {
          skip(q, stop, k & 7);
        }
      }
      out.push_back(info);
      p = stop;
    }
    if (static_cast<int32_t>(out.size()) != vocab_size())
      throw TokenizerError("tokenizer '" + source_ + "': " + std::to_string(out.size()) +
                           " pieces in the model file, " + std::to_string(vocab_size()) +
                           " in sentencepiece");
  });
  return handle_->pieces;
}

int32_t Tokenizer::vocab_size() const {
  if (bpe_) return bpe_->vocab_size();
  return spm().vocab_size(handle_->spm);
}

}  // namespace minimind
