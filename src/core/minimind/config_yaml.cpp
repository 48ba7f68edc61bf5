// YAML <-> Config: strict parsing (unknown keys, wrong types and duplicates are errors
// that name the key and line), --set overrides, and writing the resolved config back.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "minimind/config.h"
#include "minimind/util/input_file.h"

namespace fs = std::filesystem;

namespace minimind {
namespace {

const Field* find_field(const std::string& section, const std::string& key) {
  for (const auto& f : config_fields())
    if (section == f.section && key == f.key) return &f;
  return nullptr;
}

bool is_section(const std::string& s) {
  for (const auto& f : config_fields())
    if (s == f.section) return true;
  return false;
}

std::string keys_of(const std::string& section) {
  std::string out;
  for (const auto& f : config_fields())
    if (section == f.section) out += (out.empty() ? "" : ", ") + std::string(f.key);
  return out;
}

std::string where(const std::string& source, const YAML::Node& node) {
  const YAML::Mark m = node.Mark();
  if (m.line < 0) return source;
  return source + " line " + std::to_string(m.line + 1);
}

[[noreturn]] void type_error(const std::string& key, const std::string& origin,
                             const std::string& expected, const YAML::Node& node) {
  std::string got = node.IsScalar()     ? "\"" + node.Scalar() + "\""
                    : node.IsSequence() ? "a list"
                    : node.IsMap()      ? "a mapping"
                                        : "nothing";
  throw ConfigError("config error: " + key + " (" + origin + "): expected " + expected + ", got " +
                    got);
}

bool parse_int(const std::string& s, int64_t& out) {
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end && !s.empty();
}

bool parse_double(const std::string& s, double& out) {
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

// Stores one YAML value into the field, checking its type.
void assign(Config& cfg, const Field& field, const YAML::Node& node, const std::string& origin) {
  const std::string key = field.path();
  const bool null = node.IsNull();
  FieldRef ref = field.bind(cfg);
  if (auto* p = std::get_if<std::vector<std::string>*>(&ref)) {
    // A list of names: [a, b] (in a file or --set), one name, or null / [] for none.
    (*p)->clear();
    if (node.IsSequence()) {
      for (const auto& item : node) {
        if (!item.IsScalar() || item.Scalar().empty())
          type_error(key, origin, "a list of names, e.g. [router, experts]", node);
        (*p)->push_back(item.Scalar());
      }
    } else if (node.IsScalar() && !node.Scalar().empty()) {
      (*p)->push_back(node.Scalar());
    } else if (!null && !(node.IsScalar() && node.Scalar().empty())) {
      type_error(key, origin, "a list of names, e.g. [router, experts]", node);
    }
    cfg.origin[key] = origin;
    return;
  }
  if (!null && !node.IsScalar()) type_error(key, origin, "a single value", node);
  const std::string s = null ? "" : node.Scalar();

  if (auto* p = std::get_if<int64_t*>(&ref)) {
    if (!parse_int(s, **p)) type_error(key, origin, "an integer", node);
  } else if (auto* p = std::get_if<std::optional<int64_t>*>(&ref)) {
    int64_t v = 0;
    if (null) {
      **p = std::nullopt;  // derived from other keys at validation
    } else if (parse_int(s, v)) {
      **p = v;
    } else {
      type_error(key, origin, "an integer or null (derived)", node);
    }
  } else if (auto* p = std::get_if<double*>(&ref)) {
    if (!parse_double(s, **p)) type_error(key, origin, "a number", node);
  } else if (auto* p = std::get_if<bool*>(&ref)) {
    if (s == "true" || s == "True" || s == "TRUE") {
      **p = true;
    } else if (s == "false" || s == "False" || s == "FALSE") {
      **p = false;
    } else {
      type_error(key, origin, "true or false", node);
    }
  } else if (auto* p = std::get_if<std::string*>(&ref)) {
    **p = s;
  } else {
    std::visit(
        [&](auto* target) {
          using T = std::remove_pointer_t<decltype(target)>;
          if constexpr (std::is_enum_v<T>)
            if (null || !parse_choice(s, *target))
              type_error(key, origin, "one of " + choice_list<T>(), node);
        },
        ref);
  }
  cfg.origin[key] = origin;
}

void parse_root(Config& cfg, const YAML::Node& root, const std::string& source) {
  if (root.IsNull()) return;  // an empty file: all defaults
  if (!root.IsMap())
    throw ConfigError("config error: " + where(source, root) +
                      ": the top level must be a mapping of sections (run, model, data, "
                      "train, log)");
  std::map<std::string, int> seen_sections;
  for (const auto& sec : root) {
    // A key that is not a plain word (a list or a mapping used as a key) names nothing.
    if (!sec.first.IsScalar())
      throw ConfigError("config error: " + where(source, sec.first) +
                        ": a section name must be a plain word (run, model, data, train, log)");
    const std::string name = sec.first.as<std::string>();
    if (name == "base") continue;  // the file loader's (load_file)
    if (!is_section(name))
      throw ConfigError("config error: unknown section '" + name + "' (" +
                        where(source, sec.first) + "); sections are run, model, data, train, log");
    if (seen_sections[name]++)
      throw ConfigError("config error: section '" + name + "' appears twice (" +
                        where(source, sec.first) + ")");
    if (sec.second.IsNull()) continue;
    if (!sec.second.IsMap())
      throw ConfigError("config error: section '" + name + "' (" + where(source, sec.second) +
                        ") must be a mapping of keys");
    std::map<std::string, int> seen_keys;
    for (const auto& kv : sec.second) {
      if (!kv.first.IsScalar())
        throw ConfigError("config error: " + where(source, kv.first) + ": a key of section '" +
                          name + "' must be a plain word; keys of '" + name +
                          "' are: " + keys_of(name));
      const std::string key = kv.first.as<std::string>();
      const Field* field = find_field(name, key);
      if (!field)
        throw ConfigError("config error: unknown key '" + name + "." + key + "' (" +
                          where(source, kv.first) + "); keys of '" + name +
                          "' are: " + keys_of(name));
      if (seen_keys[key]++)
        throw ConfigError("config error: key '" + name + "." + key + "' appears twice (" +
                          where(source, kv.first) + ")");
      assign(cfg, *field, kv.second, where(source, kv.second));
    }
  }
}

// The line (1-based) where a second YAML document starts, 0 when there is none. Document
// markers are only markers at the start of a line: a "---" after the first document's
// content, or any content after a "..." that ended it. Read from the text because
// yaml-cpp 0.7's LoadAll never returns on some malformed inputs (found by fuzz_config).
int64_t second_document_line(const std::string& text) {
  std::istringstream in(text);
  bool content = false, ended = false;
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    auto marker = [&](const char* m) {
      return line.rfind(m, 0) == 0 &&
             (line.size() == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r');
    };
    const size_t first = line.find_first_not_of(" \t\r");
    const bool blank = first == std::string::npos || line[first] == '#';
    if (marker("---")) {
      if (content || ended) return n;
      content = true;  // the first document's explicit start (and maybe its content)
    } else if (marker("...")) {
      ended = true;
    } else if (!blank && line[0] != '%') {
      if (ended) return n;
      content = true;
    }
  }
  return 0;
}

YAML::Node load_yaml(const std::string& text, const std::string& source) {
  // One document per config: what follows a `---` would otherwise be ignored unread.
  if (const int64_t line = second_document_line(text); line > 0)
    throw ConfigError("config error: " + source + " line " + std::to_string(line) +
                          ": a second YAML document (after --- or ...); a config is one document",
                      "merge the two into one, or use base: FILE.yaml to start from another");
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError("config error: " + source + " line " + std::to_string(e.mark.line + 1) +
                      ": invalid YAML: " + e.msg);
  }
}

// The `base:` of a file's root, resolved against the file's directory; "" without one.
std::string base_of(const YAML::Node& root, const std::string& path) {
  if (!root.IsMap() || !root["base"]) return "";
  const YAML::Node node = root["base"];
  if (!node.IsScalar() || node.Scalar().empty())
    throw ConfigError("config error: base (" + where(path, node) +
                      "): expected the file name of the config this one starts from, e.g. "
                      "base: moe.yaml");
  int seen = 0;
  for (const auto& kv : root)
    if (kv.first.IsScalar() && kv.first.Scalar() == "base" && ++seen == 2)
      throw ConfigError("config error: key 'base' appears twice (" + where(path, kv.first) + ")");
  fs::path base(node.Scalar());
  if (base.is_relative()) base = fs::absolute(fs::path(path)).parent_path() / base;
  if (fs::is_regular_file(base)) return base.lexically_normal().string();
  // Not beside this file: a shipped preset of that name ("moe" or "moe.yaml").
  bool preset = false;
  for (const auto& [name, file] : list_presets())
    preset |= node.Scalar() == name || node.Scalar() == name + ".yaml";
  if (preset) return find_config_file(node.Scalar());
  throw ConfigError("config error: base (" + where(path, node) + "): no config file '" +
                        base.lexically_normal().string() + "' and no preset of that name",
                    "name a file beside this one (base: my-base.yaml), give its path, or name a "
                    "preset (minimind-train --list-presets)");
}

// A file over its base (and its base's base): the base's values first, then this file's.
// chain: the files being loaded, outermost first, to name a cycle.
Config load_file(const std::string& path, std::vector<std::string>& chain) {
  InputFile in = open_input<ConfigError>(path, "config error: config file", "a YAML file");
  std::stringstream text;
  text << in.read_all();
  const std::string id = fs::weakly_canonical(fs::absolute(path)).string();
  for (const auto& c : chain)
    if (fs::weakly_canonical(fs::absolute(c)).string() == id) {
      std::string loop;
      for (const auto& f : chain) loop += f + " -> ";
      throw ConfigError("config error: base: the configs name each other in a cycle: " + loop +
                        path);
    }
  const YAML::Node root = load_yaml(text.str(), path);
  Config cfg;
  const std::string base = base_of(root, path);
  if (!base.empty()) {
    chain.push_back(path);
    cfg = load_file(base, chain);
    chain.pop_back();
    cfg.origin.erase("run.name");
  }
  parse_root(cfg, root, path);
  // run.name names the run directory: a variant that does not name itself is named after
  // its file, not its base (whose runs it would otherwise resume or refuse).
  if (!base.empty() && !cfg.origin.count("run.name")) {
    cfg.run.name = fs::path(path).stem().string();
    cfg.origin["run.name"] = path + " (its file name)";
  }
  const fs::path dir = fs::absolute(fs::path(path)).parent_path();
  for (auto [key, value] :
       {std::pair{"data.train", &cfg.data.train}, std::pair{"data.val", &cfg.data.val},
        std::pair{"data.tokenizer", &cfg.data.tokenizer},
        std::pair{"train.init_from", &cfg.train.init_from}})
    if (cfg.origin.count(key) && !value->empty() && fs::path(*value).is_relative())
      *value = (dir / *value).lexically_normal().string();
  return cfg;
}

}  // namespace

Config load_config_string(const std::string& yaml, const std::string& source_name) {
  const YAML::Node root = load_yaml(yaml, source_name);
  if (root.IsMap() && root["base"])
    throw ConfigError("config error: base (" + where(source_name, root["base"]) +
                      "): only a config file can start from another");
  Config cfg;
  parse_root(cfg, root, source_name);
  return cfg;
}

Config load_config_file(const std::string& path) {
  std::vector<std::string> chain;
  return load_file(path, chain);
}

void apply_override(Config& cfg, const std::string& assignment) {
  const std::string origin = "--set " + assignment;
  const auto eq = assignment.find('=');
  const auto dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw ConfigError("config error: " + origin +
                      ": expected section.key=value, e.g. "
                      "--set train.max_steps=100");
  const std::string section = assignment.substr(0, dot);
  const std::string key = assignment.substr(dot + 1, eq - dot - 1);
  const Field* field = find_field(section, key);
  if (!field) {
    std::string hint = is_section(section) ? "keys of '" + section + "' are: " + keys_of(section)
                                           : "sections are run, model, data, train, log";
    throw ConfigError("config error: unknown key '" + section + "." + key + "' (" + origin + "); " +
                      hint);
  }
  // Parse the value as YAML so `null`, quoted strings and numbers behave as in a file;
  // a string key whose text is not a single YAML scalar (a path with ": ") takes it raw.
  const std::string text = assignment.substr(eq + 1);
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::Exception&) {
  }
  const bool is_string = std::holds_alternative<std::string*>(field->bind(cfg));
  if (is_string && !(value.IsScalar() || value.IsNull())) value = YAML::Node(text);
  if (!value.IsDefined()) value = load_yaml(text, origin);  // reports the YAML error
  assign(cfg, *field, value, origin);
}

namespace {
// The name of a choice field's value ("" for other fields).
std::string choice_text(const FieldRef& ref) {
  return std::visit(
      [](auto* target) -> std::string {
        using T = std::remove_pointer_t<decltype(target)>;
        if constexpr (std::is_enum_v<T>) return name_of(*target);
        return "";
      },
      ref);
}

std::string value_text(Config& cfg, const Field& f) {
  FieldRef ref = f.bind(cfg);
  if (auto* p = std::get_if<int64_t*>(&ref)) return std::to_string(**p);
  if (auto* p = std::get_if<std::optional<int64_t>*>(&ref))
    return **p ? std::to_string(***p) : "null";
  if (auto* p = std::get_if<double*>(&ref)) return fmt::format("{}", **p);
  if (auto* p = std::get_if<bool*>(&ref)) return **p ? "true" : "false";
  if (auto* p = std::get_if<std::string*>(&ref)) return "\"" + **p + "\"";
  if (auto* p = std::get_if<std::vector<std::string>*>(&ref)) {
    std::string list;
    for (const std::string& name : **p) list += (list.empty() ? "" : ", ") + name;
    return "[" + list + "]";
  }
  return "\"" + choice_text(ref) + "\"";  // written as the strings they were
}
}  // namespace

std::vector<std::pair<std::string, std::string>> config_values(const Config& cfg_in) {
  Config cfg = cfg_in;  // bind() needs a mutable Config; nothing is changed
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : config_fields()) out.emplace_back(f.path(), value_text(cfg, f));
  return out;
}

std::vector<std::string> config_differences(const Config& a_in, const Config& b_in,
                                            const std::string& section) {
  Config a = a_in, b = b_in;
  std::vector<std::string> out;
  for (const auto& f : config_fields()) {
    if (!section.empty() && section != f.section) continue;
    const std::string va = value_text(a, f), vb = value_text(b, f);
    if (va != vb) out.push_back(f.path() + ": " + va + " -> " + vb);
  }
  return out;
}

std::string config_to_yaml(const Config& cfg_in) {
  Config cfg = cfg_in;  // bind() needs a mutable Config; nothing is changed
  YAML::Emitter out;
  out << YAML::Comment("resolved minimind-cpp config (defaults and derived sizes filled in)");
  out << YAML::BeginMap;
  std::string section;
  for (const auto& f : config_fields()) {
    if (section != f.section) {
      if (!section.empty()) out << YAML::EndMap;
      section = f.section;
      out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    }
    out << YAML::Key << f.key << YAML::Value;
    FieldRef ref = f.bind(cfg);
    if (auto* p = std::get_if<int64_t*>(&ref)) {
      out << **p;
    } else if (auto* p = std::get_if<std::optional<int64_t>*>(&ref)) {
      if (**p)
        out << ***p;
      else
        out << YAML::Null;
    } else if (auto* p = std::get_if<double*>(&ref)) {
      // Shortest text that reads back to the same double, written as a YAML 1.1 float too
      // (a '.' in the mantissa: PyYAML reads "1e-06" as a string, "1.0e-06" as a number).
      std::string s = fmt::format("{}", **p);
      const size_t e = s.find_first_of("eE");
      const size_t mantissa_end = e == std::string::npos ? s.size() : e;
      if (s.find_first_of(".n") == std::string::npos) s.insert(mantissa_end, ".0");
      out << s;
    } else if (auto* p = std::get_if<bool*>(&ref)) {
      out << (**p ? "true" : "false");
    } else if (auto* p = std::get_if<std::string*>(&ref)) {
      out << YAML::DoubleQuoted << **p;
    } else if (auto* p = std::get_if<std::vector<std::string>*>(&ref)) {
      out << YAML::Flow << YAML::BeginSeq;
      for (const std::string& name : **p) out << name;
      out << YAML::EndSeq;
    } else {
      out << YAML::DoubleQuoted << choice_text(ref);
    }
  }
  out << YAML::EndMap << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace minimind
