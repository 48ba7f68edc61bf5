#include "minimind/data/batcher.h"

#include <algorithm>

namespace minimind {

BatchSampler::BatchSampler(const TokenFile& tokens, std::string mode, int64_t batch_size,
                           int64_t max_seq_len, uint64_t seed, int64_t rank, int64_t world_size,
                           std::shared_ptr<const SftIndex> sft, SftRowsOptions sft_rows)
    : tokens_(tokens),
      mode_(std::move(mode)),
      batch_size_(batch_size),
      max_seq_len_(max_seq_len),
      seed_(seed),
      rank_(rank),
      world_size_(world_size),
      sft_(std::move(sft)),
      sft_rows_(sft_rows) {
  sft_rows_.max_seq_len = max_seq_len_;
  if (mode_ == "sft") {
    if (!sft_)
      throw DataError("data.mode sft: token file '" + tokens_.path() + "' without its index");
    if (sft_->may_add_system.size() != units())
      throw DataError(
          "chat data index of '" + tokens_.path() + "' holds " +
              std::to_string(sft_->may_add_system.size()) + " conversations, the file " +
              std::to_string(units()),
          "delete the cache directory's tokens/ folder: the next run prepares it again");
    if (units() < static_cast<uint64_t>(batch_size_))
      throw DataError("corpus '" + tokens_.path() +
                      "' is too small for one batch: " + std::to_string(units()) +
                      " conversations, train.batch_size is " + std::to_string(batch_size_));
  } else if (mode_ == "pack") {
    if (tokens_.num_tokens() < static_cast<uint64_t>(max_seq_len_ + 1))
      throw DataError("corpus '" + tokens_.path() +
                      "' is too small for one batch: " + std::to_string(tokens_.num_tokens()) +
                      " tokens, a row needs " + std::to_string(max_seq_len_ + 1) +
                      " (data.max_seq_len + 1); use more "
                      "text or a smaller data.max_seq_len");
  } else if (mode_ == "pad") {
    if (tokens_.num_docs() < static_cast<uint64_t>(batch_size_))
      throw DataError("corpus '" + tokens_.path() +
                      "' is too small for one batch: " + std::to_string(tokens_.num_docs()) +
                      " documents, train.batch_size is " + std::to_string(batch_size_));
  } else {
    throw DataError("unknown data.mode '" + mode_ + "'");
  }
}

Batch BatchSampler::batch(int64_t index) const {
  const int64_t global = index * world_size_ + rank_;
  return mode_ == "pack"  ? pack_batch(global)
         : mode_ == "pad" ? pad_batch(global)
                          : sft_batch(global);
}

Batch BatchSampler::pack_batch(int64_t global_batch) const {
  const int64_t L = max_seq_len_ + 1;
  const uint64_t starts = tokens_.num_tokens() - static_cast<uint64_t>(L) + 1;
  torch::Tensor ids = torch::empty({batch_size_, L}, torch::kLong);  // [B, T + 1]
  int64_t* out = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < batch_size_; ++r) {
    const uint64_t row = static_cast<uint64_t>(global_batch * batch_size_ + r);
    const uint64_t start = mix64(seed_ ^ mix64(row)) % starts;
    tokens_.copy(start, static_cast<uint64_t>(L), out + r * L);
  }
  return {ids, ids.clone()};
}

const std::vector<uint32_t>& BatchSampler::epoch_order(int64_t epoch) const {
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;
  if (orders_.size() > 2) orders_.erase(orders_.begin());  // only recent epochs are needed
  // Fisher-Yates with mix64: the same order on every platform.
  std::vector<uint32_t> order(units());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  uint64_t state = mix64(seed_ ^ mix64(static_cast<uint64_t>(epoch) + 0x5eed));
  for (size_t i = order.size(); i > 1; --i) {
    state = mix64(state);
    std::swap(order[i - 1], order[state % i]);
  }
  return orders_.emplace(epoch, std::move(order)).first->second;
}

int64_t fill_pad_row(const TokenFile& tokens, uint64_t doc, int64_t L, int64_t* ids,
                     int64_t* labels) {
  const uint64_t body = tokens.doc_length(doc) - 2;
  const int64_t keep = static_cast<int64_t>(std::min<uint64_t>(body, static_cast<uint64_t>(L - 2)));
  const int64_t pad = tokens.pad_id();
  std::fill(ids, ids + L, pad);
  std::fill(labels, labels + L, -100);
  ids[0] = tokens.bos_of(doc);
  tokens.copy(tokens.doc_start(doc) + 1, static_cast<uint64_t>(keep), ids + 1);
  ids[keep + 1] = tokens.eos_of(doc);
  // MiniMind masks every position that holds the pad id, padding or not: a tokenizer.json
  // turns "<|endoftext|>" typed in a text into that id, and it is not learnt there either.
  std::transform(ids, ids + keep + 2, labels, [pad](int64_t id) { return id == pad ? -100 : id; });
  return keep + 2;
}

Batch BatchSampler::pad_batch(int64_t global_batch) const {
  const int64_t L = max_seq_len_;
  torch::Tensor ids = torch::empty({batch_size_, L}, torch::kLong);  // [B, T]
  torch::Tensor labels = torch::empty({batch_size_, L}, torch::kLong);
  const uint64_t D = tokens_.num_docs();
  for (int64_t r = 0; r < batch_size_; ++r) {
    const uint64_t row = static_cast<uint64_t>(global_batch * batch_size_ + r);
    const uint64_t doc = epoch_order(static_cast<int64_t>(row / D))[row % D];
    fill_pad_row(tokens_, doc, L, ids.data_ptr<int64_t>() + r * L,
                 labels.data_ptr<int64_t>() + r * L);
  }
  return {ids, labels};
}

Batch BatchSampler::sft_batch(int64_t global_batch) const {
  const int64_t L = max_seq_len_;
  torch::Tensor ids = torch::empty({batch_size_, L}, torch::kLong);     // [B, T]
  torch::Tensor labels = torch::empty({batch_size_, L}, torch::kLong);  // [B, T]
  const uint64_t N = units();
  for (int64_t r = 0; r < batch_size_; ++r) {
    const uint64_t row = static_cast<uint64_t>(global_batch * batch_size_ + r);
    const uint64_t epoch = row / N, conv = epoch_order(static_cast<int64_t>(epoch))[row % N];
    // The conversation's augmentations in this epoch: a draw of its own, as MiniMind draws
    // them anew each time a row is made.
    const uint64_t draw = mix64(seed_ ^ mix64(epoch * N + conv) ^ 0x5f7a11ULL);
    fill_sft_row(tokens_, *sft_, conv, draw, sft_rows_, ids.data_ptr<int64_t>() + r * L,
                 labels.data_ptr<int64_t>() + r * L);
  }
  return {ids, labels};
}

}  // namespace minimind
