#include "minimind/data/batcher.h"

#include <algorithm>
#include <deque>

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
    if (!sft_rows_.packing && units() < static_cast<uint64_t>(batch_size_))
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
  return mode_ == "pack"     ? pack_batch(global)
         : mode_ == "pad"    ? pad_batch(global)
         : sft_rows_.packing ? packed_sft_batch(global)
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
  return {ids, ids.clone(), {}};
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
  return {ids, labels, {}};
}

Batch BatchSampler::sft_batch(int64_t global_batch) const {
  const int64_t L = max_seq_len_;
  torch::Tensor ids = torch::empty({batch_size_, L}, torch::kLong);     // [B, T]
  torch::Tensor labels = torch::empty({batch_size_, L}, torch::kLong);  // [B, T]
  const uint64_t N = units();
  for (int64_t r = 0; r < batch_size_; ++r) {
    const uint64_t row = static_cast<uint64_t>(global_batch * batch_size_ + r);
    const uint64_t epoch = row / N, conv = epoch_order(static_cast<int64_t>(epoch))[row % N];
    fill_sft_row(tokens_, *sft_, conv, sft_draw(epoch, conv), sft_rows_,
                 ids.data_ptr<int64_t>() + r * L, labels.data_ptr<int64_t>() + r * L);
  }
  return {ids, labels, {}};
}

uint64_t BatchSampler::sft_draw(uint64_t epoch, uint64_t conv) const {
  return mix64(seed_ ^ mix64(epoch * units() + conv) ^ 0x5f7a11ULL);
}

RowPacking pack_rows(const std::vector<int64_t>& lengths, int64_t row_len, int64_t open) {
  struct Open {
    int64_t used = 0;
    std::vector<uint32_t> items;
  };
  RowPacking out;
  std::deque<Open> rows;
  const auto close_oldest = [&] {
    out.items.insert(out.items.end(), rows.front().items.begin(), rows.front().items.end());
    out.first.push_back(static_cast<uint32_t>(out.items.size()));
    rows.pop_front();
  };
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t n = lengths[i];
    auto it = std::find_if(rows.begin(), rows.end(),
                           [&](const Open& r) { return r.used + n <= row_len; });
    if (it == rows.end()) {
      if (static_cast<int64_t>(rows.size()) == open) close_oldest();
      it = rows.insert(rows.end(), Open{});
    }
    it->used += n;
    it->items.push_back(static_cast<uint32_t>(i));
  }
  while (!rows.empty()) close_oldest();
  return out;
}

const RowPacking& BatchSampler::packed_epoch(int64_t epoch) const {
  auto it = packings_.find(epoch);
  if (it != packings_.end()) return it->second;
  if (packings_.size() > 2) packings_.erase(packings_.begin());  // only recent epochs are needed
  const std::vector<uint32_t>& order = epoch_order(epoch);
  std::vector<int64_t> lengths(order.size());
  for (size_t i = 0; i < order.size(); ++i)
    lengths[i] = sft_row_length(tokens_, *sft_, order[i],
                                sft_draw(static_cast<uint64_t>(epoch), order[i]), sft_rows_);
  return packings_.emplace(epoch, pack_rows(lengths, max_seq_len_)).first->second;
}

std::pair<int64_t, int64_t> BatchSampler::packed_row_at(int64_t row) const {
  for (int64_t epoch = 0;; ++epoch) {
    if (static_cast<size_t>(epoch) == epoch_rows_.size())
      epoch_rows_.push_back(packed_epoch(epoch).rows());
    if (row < epoch_rows_[static_cast<size_t>(epoch)]) return {epoch, row};
    row -= epoch_rows_[static_cast<size_t>(epoch)];
  }
}

Batch BatchSampler::packed_sft_batch(int64_t global_batch) const {
  const int64_t L = max_seq_len_;
  torch::Tensor ids = torch::empty({batch_size_, L}, torch::kLong);     // [B, T]
  torch::Tensor labels = torch::empty({batch_size_, L}, torch::kLong);  // [B, T]
  torch::Tensor starts = torch::empty({batch_size_, L}, torch::kLong);  // [B, T]
  std::vector<int64_t> conv_ids(static_cast<size_t>(L)), conv_labels(static_cast<size_t>(L));
  for (int64_t r = 0; r < batch_size_; ++r) {
    const auto [epoch, at] = packed_row_at(global_batch * batch_size_ + r);
    const RowPacking& rows = packed_epoch(epoch);
    const std::vector<uint32_t>& order = epoch_order(epoch);
    int64_t *row_ids = ids.data_ptr<int64_t>() + r * L,
            *row_labels = labels.data_ptr<int64_t>() + r * L,
            *row_starts = starts.data_ptr<int64_t>() + r * L;
    int64_t used = 0;
    for (uint32_t k = rows.first[at]; k < rows.first[at + 1]; ++k) {
      const uint64_t conv = order[rows.items[k]];
      const int64_t n = fill_sft_row(tokens_, *sft_, conv, sft_draw(epoch, conv), sft_rows_,
                                     conv_ids.data(), conv_labels.data());
      std::copy_n(conv_ids.data(), n, row_ids + used);
      std::copy_n(conv_labels.data(), n, row_labels + used);
      row_labels[used] = -100;  // the previous conversation's last position does not predict it
      std::fill_n(row_starts + used, n, used);
      used += n;
    }
    // The tail: padding, one more document.
    std::fill(row_ids + used, row_ids + L, tokens_.pad_id());
    std::fill(row_labels + used, row_labels + L, -100);
    std::fill(row_starts + used, row_starts + L, used);
  }
  return {ids, labels, starts};
}

}  // namespace minimind
