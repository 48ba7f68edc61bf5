#include "minimind/eval/text_stream.h"

namespace minimind {

std::string TextStream::add(int32_t id) {
  ids_.push_back(id);
  const std::vector<int32_t> head(ids_.begin() + static_cast<long>(window_),
                                  ids_.begin() + static_cast<long>(printed_upto_)),
      all(ids_.begin() + static_cast<long>(window_), ids_.end());
  const std::string before = tok_.decode(head), text = tok_.decode(all);
  if (text.size() <= before.size()) return "";
  // An unfinished UTF-8 character decodes as U+FFFD until its last byte: wait for it.
  if (text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0) return "";
  printed_ += text.size() - before.size();
  window_ = printed_upto_;
  printed_upto_ = ids_.size();
  return text.substr(before.size());
}

std::string TextStream::finish() const {
  const std::string text = tok_.decode(ids_);
  return text.size() > printed_ ? text.substr(printed_) : "";
}

}  // namespace minimind
