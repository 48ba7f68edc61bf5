// Training batches from a token file, deterministic for a seed and addressable by index,
// so the loader's position is one integer (saved in checkpoints, restored on resume).
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "minimind/data/sft.h"
#include "minimind/data/token_file.h"
#include "minimind/util/mix64.h"

namespace minimind {

struct Batch {
  torch::Tensor input_ids;  // [B, L] int64
  torch::Tensor labels;     // [B, L] int64, -100 where no loss is taken (the model shifts)
};

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
};

}  // namespace minimind
