#include "minimind/data/chat.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "minimind/error.h"

namespace minimind {

namespace {

using ojson = nlohmann::ordered_json;

// ---- Python's str methods the templates call, on "\n" only.
std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}
// s.split(sep)[0] and s.split(sep)[-1].
std::string_view before_first(std::string_view s, std::string_view sep) {
  const size_t at = s.find(sep);
  return at == std::string_view::npos ? s : s.substr(0, at);
}
std::string_view after_last(std::string_view s, std::string_view sep) {
  const size_t at = s.rfind(sep);
  return at == std::string_view::npos ? s : s.substr(at + sep.size());
}

// A float as Python's repr writes it: the shortest digits that read back to it, in fixed
// notation when the decimal point falls between 10^-4 and 10^16, else as d.ddde±XX.
std::string python_float(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x < 0 ? "-Infinity" : "Infinity";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(r.ptr - buf));  // "-1.2345e+16"
  std::string out;
  if (sci.front() == '-') {
    out = "-";
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits += c;
  const int exponent = std::atoi(std::string(sci.substr(e + 1)).c_str());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int point = exponent + 1;  // digits before the decimal point
  const int n = static_cast<int>(digits.size());
  if (point > -4 && point <= 16) {
    if (point <= 0) return out + "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    if (point >= n) return out + digits + std::string(static_cast<size_t>(point - n), '0') + ".0";
    return out + digits.substr(0, point) + "." + digits.substr(point);
  }
  out += digits.substr(0, 1);
  if (n > 1) out += "." + digits.substr(1);
  return out + fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', std::abs(exponent));
}

void python_string(const std::string& s, std::string& out) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += ch;
    }
  }
  out += '"';
}

void python_json_into(const ojson& x, std::string& out) {
  switch (x.type()) {
    case ojson::value_t::null:
      out += "null";
      break;
    case ojson::value_t::boolean:
      out += x.get<bool>() ? "true" : "false";
      break;
    case ojson::value_t::number_integer:
      out += std::to_string(x.get<int64_t>());
      break;
    case ojson::value_t::number_unsigned:
      out += std::to_string(x.get<uint64_t>());
      break;
    case ojson::value_t::number_float:
      out += python_float(x.get<double>());
      break;
    case ojson::value_t::string:
      python_string(x.get_ref<const std::string&>(), out);
      break;
    case ojson::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& v : x) {
        if (!first) out += ", ";
        first = false;
        python_json_into(v, out);
      }
      out += ']';
      break;
    }
    case ojson::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [k, v] : x.items()) {
        if (!first) out += ", ";
        first = false;
        python_string(k, out);
        out += ": ";
        python_json_into(v, out);
      }
      out += '}';
      break;
    }
    default:
      throw DataError("a JSON value of a kind Python's json cannot write");
  }
}

// A field that may be absent or null; anything but a string is the reason returned.
std::string read_text(const ojson& turn, const char* key, std::optional<std::string>& out) {
  const auto it = turn.find(key);
  if (it == turn.end() || it->is_null()) return "";
  if (!it->is_string()) return fmt::format("\"{}\" is {}, not a string", key, it->type_name());
  out = it->get<std::string>();
  return "";
}

// tools or tool_calls: a JSON list, or a string holding one (JSON null: none). `present`:
// the field is truthy as MiniMind tests it (a non-empty string or list); then `out` holds the
// list, which may be empty (a string "[]").
std::string read_list(const ojson& turn, const char* key, ojson& out, bool& present) {
  const auto it = turn.find(key);
  present = false;
  if (it == turn.end() || it->is_null()) return "";
  ojson list;
  if (it->is_string()) {
    const std::string& text = it->get_ref<const std::string&>();
    if (text.empty()) return "";
    list = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    if (list.is_discarded()) return fmt::format("\"{}\" is a string that is not JSON", key);
    present = true;
    if (list.is_null()) list = ojson::array();
  } else {
    list = *it;
    present = list.is_array() && !list.empty();
  }
  if (!list.is_array())
    return fmt::format("\"{}\" holds a JSON {}, not a list", key, list.type_name());
  if (present) out = std::move(list);
  return "";
}

// A tool call as the templates read it: its "function" object when it has one, with a
// string name and arguments of any kind.
std::string check_tool_call(const ojson& call) {
  if (!call.is_object()) return "a tool call is not an object";
  const ojson* c = &call;
  if (const auto f = call.find("function"); f != call.end() && !f->is_null()) {
    if (!f->is_object()) return "a tool call's \"function\" is not an object";
    if (!f->empty()) c = &*f;
  }
  const auto name = c->find("name");
  if (name == c->end() || !name->is_string()) return "a tool call has no string \"name\"";
  if (c->find("arguments") == c->end()) return "a tool call has no \"arguments\"";
  return "";
}

const ojson& call_body(const ojson& call) {
  const auto f = call.find("function");
  return f != call.end() && f->is_object() && !f->empty() ? *f : call;
}

// The tools block both templates write when tools are offered.
void tools_block(const Conversation& c, const ojson& tools, std::string& out) {
  out += "<|im_start|>system\n";
  if (c.messages.front().role == "system") out += c.messages.front().content + "\n\n";
  out +=
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
      "provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const auto& tool : tools) {
    out += "\n";
    python_json_into(tool, out);
  }
  out +=
      "\n</tools>\n\nFor each function call, return a json object with function name and "
      "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
      "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
}

void tool_calls_text(const ChatMessage& m, std::string_view content, std::string& out) {
  if (m.tool_calls.is_null()) return;  // (an empty list writes nothing either)
  bool first = true;
  for (const auto& call : m.tool_calls) {
    if (!first || !content.empty()) out += "\n";
    first = false;
    const ojson& body = call_body(call);
    out += "<tool_call>\n{\"name\": \"";
    out += body.at("name").get_ref<const std::string&>();
    out += "\", \"arguments\": ";
    const ojson& args = body.at("arguments");
    if (args.is_string())
      out += args.get_ref<const std::string&>();
    else
      python_json_into(args, out);
    out += "}\n</tool_call>";
  }
}

// The tools the conversation offers: the last system turn's that names tools (MiniMind's
// create_chat_prompt), when that list is not empty.
const ojson* offered_tools(const Conversation& c) {
  const ojson* tools = nullptr;
  for (const auto& m : c.messages)
    if (m.role == "system" && m.names_tools) tools = &m.tools;
  return tools && !tools->empty() ? tools : nullptr;
}

// FNV-1a of a template's bytes: how a known text is recognised (a few bytes in the source
// instead of the template itself).
uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

}  // namespace

std::string python_json(const nlohmann::ordered_json& x) {
  std::string out;
  python_json_into(x, out);
  return out;
}

std::string parse_conversation(std::string_view line, Conversation& out) {
  out.messages.clear();
  const ojson j = ojson::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return "not valid JSON";
  if (!j.is_object()) return fmt::format("a JSON {}, not an object", j.type_name());
  const auto conv = j.find("conversations");
  if (conv == j.end()) return "no \"conversations\"";
  if (!conv->is_array())
    return fmt::format("\"conversations\" is {}, not a list", conv->type_name());
  if (conv->empty()) return "an empty conversation";
  for (size_t i = 0; i < conv->size(); ++i) {
    const ojson& turn = (*conv)[i];
    auto fail = [&](const std::string& why) { return fmt::format("turn {}: {}", i + 1, why); };
    if (!turn.is_object()) return fail("not an object");
    ChatMessage m;
    const auto role = turn.find("role");
    if (role == turn.end() || !role->is_string()) return fail("no string \"role\"");
    m.role = role->get<std::string>();
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool")
      return fail("unknown role \"" + m.role + "\" (system, user, assistant or tool)");
    std::optional<std::string> content;
    if (std::string why = read_text(turn, "content", content); !why.empty()) return fail(why);
    // The templates add the first system turn's content to a string: a null there is an
    // error in Jinja too.
    if (!content && i == 0 && m.role == "system") return fail("a system turn without content");
    m.content = content.value_or("");
    if (std::string why = read_text(turn, "reasoning_content", m.reasoning_content); !why.empty())
      return fail(why);
    bool calls = false;
    if (std::string why = read_list(turn, "tool_calls", m.tool_calls, calls); !why.empty())
      return fail(why);
    for (const auto& call : m.tool_calls)
      if (std::string why = check_tool_call(call); !why.empty()) return fail(why);
    ojson tools;
    if (std::string why = read_list(turn, "tools", tools, m.names_tools); !why.empty())
      return fail(why);
    if (m.role == "system") m.tools = std::move(tools);
    out.messages.push_back(std::move(m));
  }
  return "";
}

namespace {

// MiniMind-3's chat format as a Jinja chat_template of our own writing, for the files the
// tool writes from a tokenizer that came without one (its sentencepiece tokenizers): every
// conversation renders to the text MiniMind-3's own template gives (tests/chat_exact.sh,
// with Jinja). Every tag trims the whitespace before it, so it renders alike with or without
// transformers' trim_blocks and lstrip_blocks. (MiniMind's template also computes the last
// user query's index, which it never reads.)
constexpr const char* kMiniMind3Jinja =
    R"JINJA({#- MiniMind-3's chat format, as minimind-cpp writes it -#}
{%- if tools %}
  {{- '<|im_start|>system\n' }}
  {%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
  {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
  {%- for tool in tools %}{{- '\n' }}{{- tool | tojson }}{%- endfor %}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
  {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for m in messages %}
  {%- set text = m.content if m.content is string else '' %}
  {%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}
    {{- '<|im_start|>' + m.role + '\n' + text + '<|im_end|>\n' }}
  {%- elif m.role == 'assistant' %}
    {%- set thought = '' %}
    {%- if m.reasoning_content is string %}
      {%- set thought = m.reasoning_content %}
    {%- elif '</think>' in text %}
      {%- set thought = text.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
      {%- set text = text.split('</think>')[-1].lstrip('\n') %}
    {%- endif %}
    {{- '<|im_start|>assistant\n<think>\n' + thought.strip('\n') + '\n</think>\n\n' + text.lstrip('\n') }}
    {%- if m.tool_calls %}
      {%- for call in m.tool_calls %}
        {%- if text or not loop.first %}{{- '\n' }}{%- endif %}
        {%- set f = call.function if call.function else call %}
        {{- '<tool_call>\n{"name": "' }}{{- f.name }}{{- '", "arguments": ' }}
        {%- if f.arguments is string %}{{- f.arguments }}{%- else %}{{- f.arguments | tojson }}{%- endif %}
        {{- '}\n</tool_call>' }}
      {%- endfor %}
    {%- endif %}
    {{- '<|im_end|>\n' }}
  {%- elif m.role == 'tool' %}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
    {{- '\n<tool_response>\n' + text + '\n</tool_response>' }}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
  {{- '<|im_start|>assistant\n' }}
  {%- if open_thinking is defined and open_thinking is true %}{{- '<think>\n' }}{%- else %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %})JINJA";

}  // namespace

const std::string& ChatTemplate::jinja() const {
  static const std::string minimind3 = kMiniMind3Jinja;
  if (kind_ != Kind::minimind3)
    throw TokenizerError(std::string("no chat_template text of our own for the ") + name() +
                         " template (a tokenizer with it carries MiniMind's)");
  return minimind3;
}

ChatTemplate ChatTemplate::identify(const std::string& text, const std::string& source) {
  // The chat_template of MiniMind's model/tokenizer_config.json (minimind-3, 3,895 bytes) and
  // of its MiniMind2 generation (3,342 bytes), and ours for MiniMind-3 (jinja()).
  const uint64_t h = fnv1a(text);
  if (h == 0xa42856d092c2689bull && text.size() == 3895) return ChatTemplate(Kind::minimind3);
  if (text == kMiniMind3Jinja) return ChatTemplate(Kind::minimind3);
  if (h == 0xd2c221ad78b4395dull && text.size() == 3342) return ChatTemplate(Kind::minimind2);
  throw TokenizerError(
      "the chat_template of '" + source +
          "' is not one this tool renders (MiniMind-3's or MiniMind2's, byte for byte)",
      "use the tokenizer_config.json that came with the tokenizer, or MiniMind's own; a changed "
      "template is refused rather than rendered differently from transformers");
}

const char* ChatTemplate::name() const {
  return kind_ == Kind::minimind3 ? "MiniMind-3" : "MiniMind2";
}

std::string system_block(const std::string& prompt) {
  return "<|im_start|>system\n" + prompt + "<|im_end|>\n";
}

std::string ChatTemplate::default_system_block() const {
  return kind_ == Kind::minimind2 ? system_block("You are a helpful assistant") : std::string();
}

std::string ChatTemplate::render(const Conversation& c, const ChatPrompt& prompt) const {
  std::string out;
  const auto& ms = c.messages;
  if (ms.empty()) throw DataError("render: an empty conversation");
  if (const ojson* tools = offered_tools(c)) {
    tools_block(c, *tools, out);
  } else if (ms.front().role == "system") {
    out += system_block(ms.front().content);
  } else {
    out += default_system_block();
  }
  for (size_t i = 0; i < ms.size(); ++i) {
    const ChatMessage& m = ms[i];
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string_view content = m.content;
      out += "<|im_start|>assistant\n";
      if (kind_ == Kind::minimind3) {
        // The reasoning: reasoning_content, else what content holds before "</think>".
        std::string_view reasoning;
        if (m.reasoning_content) {
          reasoning = *m.reasoning_content;
        } else if (content.find("</think>") != std::string_view::npos) {
          reasoning = lstrip_newlines(
              after_last(rstrip_newlines(before_first(content, "</think>")), "<think>"));
          content = lstrip_newlines(after_last(content, "</think>"));
        }
        out += "<think>\n";
        out += rstrip_newlines(lstrip_newlines(reasoning));
        out += "\n</think>\n\n";
        out += lstrip_newlines(content);
      } else {
        out += content;
      }
      tool_calls_text(m, content, out);
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || ms[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == ms.size() || ms[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (prompt.generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (kind_ == Kind::minimind3)
      out += prompt.thinking ? "<think>\n" : kEmptyThink;
    else if (!prompt.thinking)
      out += kEmptyThink;
  }
  return out;
}

// MiniMind's ten system prompts (lm_dataset.py, pre_processing_chat), in its order.
const std::array<const char*, 10> kSystemPrompts = {
    "你是一个知识丰富的AI，尽力为用户提供准确的信息。",
    "你是minimind，一个小巧但有用的语言模型。",
    "你是一个专业的AI助手，请提供有价值的回答。",
    "你是minimind，请尽力帮助用户解决问题。",
    "你是一个可靠的AI，请给出准确的回答。",
    "You are a helpful AI assistant.",
    "You are minimind, a lightweight intelligent assistant.",
    "You are a friendly chatbot. Please answer the user's questions carefully.",
    "You are a knowledgeable AI. Try your best to provide accurate information.",
    "You are minimind, a small but useful language model."};

bool may_add_system_prompt(const Conversation& c) {
  for (const auto& m : c.messages)
    if (m.names_tools) return false;
  return !c.messages.empty() && c.messages.front().role != "system";
}

std::string without_empty_think(std::string text) {
  const std::string_view block = kEmptyThink;
  std::string out;
  size_t from = 0;
  for (size_t at; (at = text.find(block, from)) != std::string::npos; from = at + block.size())
    out.append(text, from, at - from);
  if (from == 0) return text;
  out.append(text, from, std::string::npos);
  return out;
}

std::vector<int64_t> sft_labels(const std::vector<int64_t>& ids, const std::vector<int32_t>& open,
                                const std::vector<int32_t>& close, int64_t max_length) {
  const size_t n = ids.size();
  std::vector<int64_t> labels(n, -100);
  auto matches = [&](size_t at, const std::vector<int32_t>& seq) {
    if (seq.empty() || at + seq.size() > n) return false;
    for (size_t k = 0; k < seq.size(); ++k)
      if (ids[at + k] != seq[k]) return false;
    return true;
  };
  size_t i = 0;
  while (i < n) {
    if (!matches(i, open)) {
      ++i;
      continue;
    }
    const size_t start = i + open.size();
    size_t end = start;
    while (end < n && !matches(end, close)) ++end;
    const size_t stop = std::min<size_t>(end + close.size(), static_cast<size_t>(max_length));
    for (size_t j = start; j < stop && j < n; ++j) labels[j] = ids[j];
    i = end < n ? end + close.size() : n;
  }
  return labels;
}

}  // namespace minimind
