// Rows that hold several documents side by side (packed chat rows, data.sft_packing): each
// position attends only to its own document's positions up to itself, and its RoPE position
// counts from its document's first position (torchtitan's rule for packed SFT). So every
// document is computed as it would be alone at the start of a row, and a packed batch has
// the loss of the padded batch of the same documents, without the padding's work.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "minimind/model/rope.h"

namespace minimind {

// One document of a row: positions [start, start + length).
struct DocumentSpan {
  int64_t start, length;
};

// The documents of one row from its starts (starts[t]: the position where t's document
// starts), in order. starts == nullptr: one document of T positions.
std::vector<DocumentSpan> row_documents(const int64_t* starts, int64_t T);

struct PackedRows {
  torch::Tensor starts;  // [B, T] int64: where each position's document starts in its row
  torch::Tensor cos,
      sin;  // [B*T, head_dim]: the RoPE rows of each position's place in its document
};

// The layout of `starts` [B, T] int64 with the rope rows it needs. Throws c10::Error unless
// every row's starts are those of consecutive documents (starts[0] = 0; starts[t] is t or
// starts[t - 1]).
PackedRows packed_rows(const torch::Tensor& starts, const RotaryTables& rope);

}  // namespace minimind
