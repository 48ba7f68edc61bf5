#include "minimind/model/feed_forward.h"

#include "minimind/model/linear.h"
#include "minimind/util/step_part.h"

namespace minimind {

FeedForwardImpl::FeedForwardImpl(int64_t hidden_size, int64_t intermediate_size,
                                 const Products& products)
    : products_(products), node_(training_node(products)) {
  // Registration order follows MiniMind's FeedForward.__init__.
  gate_proj = register_module("gate_proj", linear_no_bias(hidden_size, intermediate_size));
  down_proj = register_module("down_proj", linear_no_bias(intermediate_size, hidden_size));
  up_proj = register_module("up_proj", linear_no_bias(hidden_size, intermediate_size));
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  if (runs_own_node(node_, x)) {
    return dense_swiglu(x.reshape({-1, x.size(-1)}), gate_proj->weight, up_proj->weight,
                        down_proj->weight, products_)
        .view(x.sizes());  // [..., H]
  }
  const torch::Tensor g = project(x, gate_proj->weight, products_);  // [..., intermediate]
  const torch::Tensor u = project(x, up_proj->weight, products_);    // [..., intermediate]
  torch::Tensor a;                                                   // [..., intermediate]
  {
    const StepScope part(StepPart::activation);
    a = torch::silu(g) * u;
  }
  return project(a, down_proj->weight, products_);
}

}  // namespace minimind
