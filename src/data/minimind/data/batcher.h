// Training batches from a token file, deterministic for a seed and addressable by index,
// so the loader's position is one integer (saved in checkpoints, restored on resume).
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "minimind/data/sft.h"
#include "minimind/data/token_file.h"
#include "minimind/util/mix64.h"

namespace minimind {

struct Batch {
  torch::Tensor input_ids;  // [B, L] int64
  torch::Tensor labels;     // [B, L] int64, -100 where no loss is taken (the model shifts)
  // [B, L] int64 in packed chat rows: where each position's conversation starts in its row
  // (ForwardOptions::starts); undefined otherwise.
  torch::Tensor starts;
};

// Rows of conversations packed side by side: rows [first[r], first[r + 1]) of `items` are
// row r's conversations (indices into the lengths given), in order.
struct RowPacking {
  std::vector<uint32_t> first{0}, items;
  int64_t rows() const { return static_cast<int64_t>(first.size()) - 1; }
};

// Conversations of these lengths (each <= row_len), in this order, into rows of row_len:
// each goes to the first of the `open` newest rows with room for it; when none has, the
// oldest open row is closed (rows come out in the order they close) and a new one opened.
// Every conversation lands in exactly one row; the order within a row is the given order.
RowPacking pack_rows(const std::vector<int64_t>& lengths, int64_t row_len, int64_t open = 8);

// MiniMind's PretrainDataset row for document `doc` (stored as [bos] body [eos]):
// bos + body[:L - 2] + eos, right-padded with 0 to L; labels = ids, -100 on padding.
// ids and labels point to L int64 each. Returns the row's unpadded length.
int64_t fill_pad_row(const TokenFile& tokens, uint64_t doc, int64_t L, int64_t* ids,
                     int64_t* labels);

class BatchSampler {
 public:
  // mode "pack": each row is a random window of max_seq_len + 1 tokens of the
  //   concatenated token stream (L = max_seq_len + 1, so max_seq_len predictions);
  //   documents are [bos] text [eos], no padding.
  // mode "pad": MiniMind's PretrainDataset: one document per row, in a shuffled order
  //   per epoch; [bos] + tokens[:max_seq_len - 2] + [eos], right-padded with 0 to
  //   L = max_seq_len; labels are -100 on padding.
  // mode "sft": MiniMind's SFTDataset: one conversation per row, in a shuffled order per
  //   epoch, augmented by draws from the seed (fill_sft_row; `sft` holds the file's index
  //   and the rates), cut at max_seq_len and right-padded; labels on the answers only.
  //   With sft_rows.packing, an epoch's conversations in that order are packed side by side
  //   (pack_rows) and a row's tail is padding; Batch::starts says where each one starts, and
  //   a conversation's first label is -100 (no position before it predicts it).
  // Rank r of world w draws the rows of global batches b * w + r (disjoint shards).
  // Throws DataError when the file cannot fill one batch.
  BatchSampler(const TokenFile& tokens, std::string mode, int64_t batch_size, int64_t max_seq_len,
               uint64_t seed, int64_t rank = 0, int64_t world_size = 1,
               std::shared_ptr<const SftIndex> sft = nullptr, SftRowsOptions sft_rows = {});

  // The index-th batch of this rank: a pure function of (file, settings, seed, index).
  Batch batch(int64_t index) const;
  Batch next() { return batch(position_++); }

  int64_t position() const { return position_; }  // batches drawn so far
  void set_position(int64_t p) { position_ = p; }

 private:
  Batch pack_batch(int64_t global_batch) const;
  Batch pad_batch(int64_t global_batch) const;
  Batch sft_batch(int64_t global_batch) const;
  Batch packed_sft_batch(int64_t global_batch) const;
  // Conversation conv's augmentation draw in `epoch` (its own each epoch, as MiniMind draws
  // them anew each time a row is made).
  uint64_t sft_draw(uint64_t epoch, uint64_t conv) const;
  // Packing: epoch e's rows (conversations as positions in the epoch's order), and where the
  // global row `row` lies: (epoch, row within it).
  const RowPacking& packed_epoch(int64_t epoch) const;
  std::pair<int64_t, int64_t> packed_row_at(int64_t row) const;
  // The rows an epoch visits: documents, or conversations (two documents each) in sft mode.
  uint64_t units() const { return sft_ ? tokens_.num_docs() / 2 : tokens_.num_docs(); }
  const std::vector<uint32_t>& epoch_order(int64_t epoch) const;

  const TokenFile& tokens_;
  std::string mode_;
  int64_t batch_size_, max_seq_len_;
  uint64_t seed_;
  int64_t rank_, world_size_;
  int64_t position_ = 0;
  std::shared_ptr<const SftIndex> sft_;
  SftRowsOptions sft_rows_;
  mutable std::map<int64_t, std::vector<uint32_t>> orders_;  // pad, sft: epoch -> order
  mutable std::map<int64_t, RowPacking> packings_;           // packed sft: epoch -> rows
  mutable std::vector<int64_t> epoch_rows_;                  // packed sft: rows per epoch so far
};

}  // namespace minimind
