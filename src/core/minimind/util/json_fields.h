// Records as JSON objects through their field list, written and read in one place. A record
// lists its fields once,
//   template <class R, class F>
//   static void fields(R& r, F&& f) { f("step", r.step), f("loss", r.loss); }
// (R: the record, const when written), and write_record / read_record walk that list. Reading
// checks every field's presence and type and throws DataError naming the field.
//
// Fields: integers, numbers (a non-finite one as null, read back as NaN), booleans, strings,
// the config's closed choices (enums with names in choices.h, by name), std::optional (null or
// missing: unset), vectors, nested records (their own fields()), Tag (a value fixed for the
// record type) and OrAbsent (a field that files written before it existed lack).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "minimind/choices.h"
#include "minimind/error.h"

namespace minimind {

// A field whose value is fixed for the record type ("split": "train"); reading another
// value is an error.
struct Tag {
  const char* value;
};

// A field older files lack: read as `absent` when missing ("bf16_emulation" in compute plans
// written before the key existed).
template <class T>
struct OrAbsent {
  T& value;
  std::remove_const_t<T> absent;
};
template <class T>
OrAbsent<T> or_absent(T& value, std::remove_const_t<T> absent) {
  return {value, std::move(absent)};
}

namespace json_fields {

using json = nlohmann::json;

template <class R, class = void>
struct is_record : std::false_type {};
template <class R>
struct is_record<R, std::void_t<decltype(R::fields(std::declval<const R&>(),
                                                   std::declval<void (*)(const char*, int)>()))>>
    : std::true_type {};

// ---- Writing: each field as it is; an enum by its name; an unset optional as null.
struct Writer {
  json& j;
  void operator()(const char* key, Tag tag) { j[key] = tag.value; }
  template <class T>
  void operator()(const char* key, const OrAbsent<T>& v) {
    (*this)(key, v.value);
  }
  template <class T>
  void operator()(const char* key, const std::optional<T>& v) {
    if (v)
      (*this)(key, *v);
    else
      j[key] = json();
  }
  template <class T>
  void operator()(const char* key, const T& v) {
    j[key] = value(v);
  }
  template <class T>
  static json value(const T& v) {
    if constexpr (std::is_enum_v<T>) {
      return name_of(v);
    } else if constexpr (is_record<T>::value) {
      json out = json::object();
      T::fields(v, Writer{out});
      return out;
    } else {
      return json(v);
    }
  }
};

// ---- Reading: every field checked for presence and type; errors name the field.
[[noreturn]] inline void bad_field(const std::string& name, const json& v, const char* expected) {
  throw DataError(fmt::format("field '{}' should be {}, found {}", name, expected,
                              v.is_null() ? "null" : v.type_name()));
}

inline void read_value(const std::string& name, const json& v, int64_t& out) {
  if (!v.is_number_integer()) bad_field(name, v, "an integer");
  out = v.get<int64_t>();
}
inline void read_value(const std::string& name, const json& v, int& out) {
  if (!v.is_number_integer()) bad_field(name, v, "an integer");
  const int64_t wide = v.get<int64_t>();
  if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max())
    bad_field(name, v, "an integer of 32 bits");
  out = static_cast<int>(wide);
}
inline void read_value(const std::string& name, const json& v, double& out) {
  // JSON has no NaN or infinity: a non-finite figure (a diverged evaluation) is written as
  // null, and read back as NaN.
  if (v.is_null()) {
    out = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  if (!v.is_number()) bad_field(name, v, "a number");
  out = v.get<double>();
}
inline void read_value(const std::string& name, const json& v, bool& out) {
  if (!v.is_boolean()) bad_field(name, v, "true or false");
  out = v.get<bool>();
}
inline void read_value(const std::string& name, const json& v, std::string& out) {
  if (!v.is_string()) bad_field(name, v, "a string");
  out = v.get<std::string>();
}
template <class E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
void read_value(const std::string& name, const json& v, E& out) {
  if (!v.is_string() || !parse_choice(v.get<std::string>(), out))
    throw DataError(
        fmt::format("field '{}' is {}, not one of {}", name, v.dump(), choice_list<E>()));
}
template <class T>
void read_value(const std::string& name, const json& v, std::vector<T>& out);
template <class R, std::enable_if_t<is_record<R>::value, int> = 0>
void read_value(const std::string& name, const json& v, R& out);

struct Reader {
  const json& j;
  const json& at(const char* key) const {
    auto it = j.find(key);
    if (it == j.end()) throw DataError(fmt::format("field '{}' is missing", key));
    return *it;
  }
  void operator()(const char* key, Tag tag) const {
    const json& v = at(key);
    if (!v.is_string() || v.get<std::string>() != tag.value)
      throw DataError(
          fmt::format("field '{}' is {} where \"{}\" was expected", key, v.dump(), tag.value));
  }
  template <class T>
  void operator()(const char* key, OrAbsent<T> field) const {
    if (j.find(key) == j.end())
      field.value = std::move(field.absent);
    else
      read_value(key, at(key), field.value);
  }
  template <class T>
  void operator()(const char* key, std::optional<T>& out) const {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      out.reset();
      return;
    }
    T v{};
    read_value(key, *it, v);
    out = std::move(v);
  }
  template <class T>
  void operator()(const char* key, T& out) const {
    read_value(key, at(key), out);
  }
};

template <class T>
void read_value(const std::string& name, const json& v, std::vector<T>& out) {
  if (!v.is_array()) bad_field(name, v, "an array");
  out.assign(v.size(), T{});
  for (size_t i = 0; i < v.size(); ++i) read_value(fmt::format("{}[{}]", name, i), v[i], out[i]);
}

// A nested record: its own fields, errors prefixed with its name.
template <class R, std::enable_if_t<is_record<R>::value, int>>
void read_value(const std::string& name, const json& v, R& out) {
  if (!v.is_object()) bad_field(name, v, "an object");
  try {
    R::fields(out, Reader{v});
  } catch (const DataError& e) {
    throw DataError(name + ": " + e.message());
  }
}

}  // namespace json_fields

// r as a JSON object, field by field.
template <class R>
nlohmann::json write_record(const R& r) {
  nlohmann::json j = nlohmann::json::object();
  R::fields(r, json_fields::Writer{j});
  return j;
}

// Fills r from the object j; DataError naming the first missing or mistyped field.
template <class R>
void read_record(const nlohmann::json& j, R& r) {
  if (!j.is_object())
    throw DataError(fmt::format("expected a JSON object, found {}", j.type_name()));
  R::fields(r, json_fields::Reader{j});
}

}  // namespace minimind
