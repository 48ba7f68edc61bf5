// Packed rows (several documents a row, packed_rows.h) against the padded batch of the same
// documents, one a row: the same loss and gradients on every forward the plan can pick.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "minimind/config.h"
#include "minimind/model/minimind_model.h"
#include "minimind/model/packed_rows.h"
#include "support/test_support.h"

using namespace minimind;

namespace {

// A tiny MoE whose rows cross the attention's query blocks (64) and whose documents do too.
ModelConfig packed_model() {
  Config cfg = load_config_string(
      "model: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4,\n"
      "        num_key_value_heads: 2, vocab_size: 300, max_position_embeddings: 256,\n"
      "        use_moe: true, num_experts: 4, num_experts_per_tok: 2}\n"
      "data: {max_seq_len: 160}\n",
      "packed");
  validate_and_resolve(cfg);
  return cfg.model;
}

// Documents of these lengths, random ids 1..V-1 (0 is padding), labelled where the id is
// odd (a stand-in for the answers: any subset of targets).
std::vector<std::vector<int64_t>> documents(const std::vector<int64_t>& lengths, int64_t V) {
  std::vector<std::vector<int64_t>> docs;
  for (int64_t n : lengths) {
    const torch::Tensor ids = torch::randint(1, V, {n}, torch::kLong);
    docs.emplace_back(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n);
  }
  return docs;
}

struct Rows {
  torch::Tensor ids, labels, starts;  // [B, T] each; starts undefined when padded
};

int64_t label_of(int64_t id) {
  return id % 2 ? id : -100;
}

// One document a row, right-padded with 0 (labels -100 there).
Rows padded(const std::vector<std::vector<int64_t>>& docs, int64_t T) {
  const auto B = static_cast<int64_t>(docs.size());
  Rows r{torch::zeros({B, T}, torch::kLong), torch::full({B, T}, -100, torch::kLong), {}};
  for (int64_t b = 0; b < B; ++b)
    for (size_t t = 0; t < docs[b].size(); ++t) {
      r.ids[b][static_cast<int64_t>(t)] = docs[b][t];
      r.labels[b][static_cast<int64_t>(t)] = label_of(docs[b][t]);
    }
  return r;
}

// The documents side by side in rows of T: row_of[i] is document i's row, in order; a
// document's first label is -100 (the previous document's last position does not predict
// it); a row's tail is padding, one more document.
Rows packed(const std::vector<std::vector<int64_t>>& docs, const std::vector<int64_t>& row_of,
            int64_t B, int64_t T) {
  Rows r{torch::zeros({B, T}, torch::kLong), torch::full({B, T}, -100, torch::kLong),
         torch::empty({B, T}, torch::kLong)};
  std::vector<int64_t> used(static_cast<size_t>(B), 0);
  for (size_t i = 0; i < docs.size(); ++i) {
    const int64_t b = row_of[i], a = used[static_cast<size_t>(b)];
    for (size_t t = 0; t < docs[i].size(); ++t) {
      const int64_t at = a + static_cast<int64_t>(t);
      r.ids[b][at] = docs[i][t];
      r.labels[b][at] = t == 0 ? -100 : label_of(docs[i][t]);
      r.starts[b][at] = a;
    }
    used[static_cast<size_t>(b)] += static_cast<int64_t>(docs[i].size());
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t tail = used[static_cast<size_t>(b)];
    EXPECT_LE(tail, T);
    for (int64_t t = tail; t < T; ++t) r.starts[b][t] = tail;
  }
  return r;
}

struct Result {
  double loss;
  std::vector<torch::Tensor> grads;
};

Result loss_and_grads(MiniMindForCausalLM& model, const Rows& rows) {
  model->zero_grad();
  ForwardOptions fo;
  fo.starts = rows.starts;
  const ForwardOutput out = model(rows.ids, rows.labels, fo);
  out.loss.backward();
  Result r{out.loss.item<double>(), {}};
  for (const auto& p : model->parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

struct PackedCase {
  Precision precision;
  MatmulBackend matmul;
  double tolerance;  // on the loss, and on each gradient relative to its largest entry
};

class PackedRowsEqualPadded : public ::testing::TestWithParam<PackedCase> {};

}  // namespace

// The loss of a packed batch equals the padded batch's over the same documents, and so do
// the gradients: a document's positions see only its own keys and count from its start.
// fp32 on OpenBLAS (ATen's form, a mask) and on oneDNN and bf16 (our node, a document at a
// time), each to 1e-5 relative (measured: loss 8e-8 / 8e-8 / 2e-7, gradients 7e-7 / 8e-7 /
// 2e-7; ignoring the starts moves the gradients by 97 %).
TEST_P(PackedRowsEqualPadded, LossAndGradients) {
  const PackedCase c = GetParam();
  const test::PlanScope compute(c.precision, c.matmul);
  torch::manual_seed(3);
  const ModelConfig cfg = packed_model();
  MiniMindForCausalLM model(cfg, compute.products());
  init_weights(model);
  model->train();
  // Documents longer than a query block (64), one a whole row, and short ones.
  const auto docs = documents({70, 20, 5, 100, 33, 160, 1, 90, 64, 12}, cfg.vocab_size);
  const Rows pad = padded(docs, 160);
  const Rows pack = packed(docs, {0, 0, 0, 1, 1, 2, 1, 3, 0, 3}, 4, 160);
  EXPECT_EQ((pack.labels != -100).sum().item<int64_t>(),
            (pad.labels.narrow(1, 1, 159) != -100).sum().item<int64_t>())
      << "the same targets";
  const Result a = loss_and_grads(model, pad), b = loss_and_grads(model, pack);
  EXPECT_NEAR(b.loss, a.loss, c.tolerance * std::abs(a.loss));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) {
    const double scale = a.grads[i].abs().max().item<double>();
    EXPECT_LE((b.grads[i] - a.grads[i]).abs().max().item<double>(), c.tolerance * scale)
        << "parameter " << i << " of largest gradient " << scale;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Plans, PackedRowsEqualPadded,
    ::testing::Values(PackedCase{Precision::fp32, MatmulBackend::openblas, 1e-5},
                      PackedCase{Precision::fp32, MatmulBackend::onednn, 1e-5},
                      PackedCase{Precision::bf16, MatmulBackend::onednn, 1e-5}));

// Starts that do not describe consecutive documents are refused, naming the position.
TEST(PackedRows, RefusesStartsThatAreNotDocuments) {
  const RotaryTables rope = make_rotary_tables(8, 16, 1e6);
  const torch::Tensor good = torch::tensor({0, 0, 2, 2, 2, 5}, torch::kLong).view({1, 6});
  const PackedRows p = packed_rows(good, rope);
  // Position 4 is at place 2 of its document (which starts at 2): rope row 2.
  EXPECT_TRUE(torch::equal(p.cos[4], rope.cos[2]));
  EXPECT_TRUE(torch::equal(p.sin[5], rope.sin[0]));
  const std::vector<DocumentSpan> docs = row_documents(good.data_ptr<int64_t>(), 6);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[1].start, 2);
  EXPECT_EQ(docs[1].length, 3);
  for (const auto& bad : {std::vector<int64_t>{1, 1, 2}, std::vector<int64_t>{0, 0, 1},
                          std::vector<int64_t>{0, 2, 2}}) {
    const std::string e = test::error_of<c10::Error>([&] {
      packed_rows(torch::tensor(bad, torch::kLong).view({1, 3}), rope);
    });
    EXPECT_NE(e.find("document start"), std::string::npos) << e;
  }
}
