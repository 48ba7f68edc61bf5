#include "minimind/util/step_part.h"

#include <array>

namespace minimind {

namespace {
thread_local StepPart tls_part = StepPart::step;
}  // namespace

const char* step_part_scope(StepPart part) {
  static constexpr std::array<const char*, kStepParts> names = {"minimind::step",
                                                                "minimind::product_forward",
                                                                "minimind::product_grad_input",
                                                                "minimind::product_grad_weight",
                                                                "minimind::attention",
                                                                "minimind::norm",
                                                                "minimind::activation",
                                                                "minimind::rope",
                                                                "minimind::routing",
                                                                "minimind::dispatch",
                                                                "minimind::embedding",
                                                                "minimind::loss",
                                                                "minimind::optimizer",
                                                                "minimind::cast",
                                                                "minimind::wait"};
  return names.at(static_cast<size_t>(part));
}

StepPart current_step_part() {
  return tls_part;
}

StepScope::StepScope(StepPart part) : outer_(tls_part) {
  tls_part = part;
  // Only while a profiler listens: a RecordFunction with no callbacks is inactive.
  if (at::hasCallbacks()) {
    record_.emplace(at::RecordScope::USER_SCOPE);
    if (record_->isActive()) record_->before(step_part_scope(part));
  }
}

StepScope::~StepScope() {
  record_.reset();  // ends the scope first
  tls_part = outer_;
}

}  // namespace minimind
