#include "minimind/model/packed_rows.h"

namespace minimind {

std::vector<DocumentSpan> row_documents(const int64_t* starts, int64_t T) {
  if (!starts) return {{0, T}};
  std::vector<DocumentSpan> docs;
  for (int64_t t = 0; t < T; ++t)
    if (starts[t] == t)
      docs.push_back({t, 1});
    else
      ++docs.back().length;
  return docs;
}

PackedRows packed_rows(const torch::Tensor& starts, const RotaryTables& rope) {
  TORCH_CHECK(starts.dim() == 2 && starts.scalar_type() == torch::kLong && !starts.is_cuda(),
              "document starts must be [B, T] int64 on the CPU, got ", starts.sizes());
  const torch::Tensor s = starts.contiguous();
  const int64_t B = s.size(0), T = s.size(1);
  const int64_t* p = s.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t v = p[b * T + t];
      TORCH_CHECK(v == t || (t > 0 && v == p[b * T + t - 1]), "row ", b, " position ", t,
                  ": a document start must be the position itself or the previous one's, got ", v);
    }
  const torch::Tensor pos = (torch::arange(T, torch::kLong).unsqueeze(0) - s).reshape({-1});
  TORCH_CHECK(pos.max().item<int64_t>() < rope.cos.size(0),
              "a document longer than max_position_embeddings (", rope.cos.size(0), ")");
  return {s, rope.cos.index_select(0, pos), rope.sin.index_select(0, pos)};  // [B*T, d] each
}

}  // namespace minimind
