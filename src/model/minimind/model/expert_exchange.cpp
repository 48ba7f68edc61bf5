#include "minimind/model/expert_exchange.h"

namespace minimind {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct ExchangeRows : torch::autograd::Function<ExchangeRows> {
  // `exchange` rides along as an address: autograd's saved data holds no C++ object, and
  // the exchange outlives every graph built while it is set on the model (the trainer's).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& rows, int64_t exchange,
                               std::vector<int64_t> send, std::vector<int64_t> recv,
                               int64_t channel) {
    auto* ex = reinterpret_cast<ExpertExchange*>(exchange);
    ctx->saved_data["exchange"] = exchange;
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    ctx->saved_data["channel"] = channel;
    return ex->all_to_all(rows, send, recv, static_cast<int>(channel));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto* ex = reinterpret_cast<ExpertExchange*>(ctx->saved_data["exchange"].toInt());
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    const int channel = static_cast<int>(ctx->saved_data["channel"].toInt());
    torch::Tensor g = ex->all_to_all(grad_out[0].contiguous(), recv, send, channel);
    return {g, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor exchange_rows(ExpertExchange& exchange, const torch::Tensor& rows,
                            const std::vector<int64_t>& send, const std::vector<int64_t>& recv,
                            int channel) {
  return ExchangeRows::apply(rows, reinterpret_cast<int64_t>(&exchange), send, recv,
                             static_cast<int64_t>(channel));
}

}  // namespace minimind
