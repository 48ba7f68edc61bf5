// The matrix products (util/matmul.h, model/linear.h): each library, precision and operand
// layout against a float64 product, the bf16 rounding against torch's, the parameter copies,
// and the refusal of bf16 on a CPU without bf16 instructions.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "minimind/error.h"
#include "minimind/model/linear.h"
#include "minimind/train/optim.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/matmul.h"
#include "minimind/util/matmul_peak.h"
#include "minimind/util/stopwatch.h"
#include "support/test_support.h"

namespace minimind {
namespace {

// The values a bf16 product sees: x rounded to bf16, as float64.
torch::Tensor rounded(const torch::Tensor& x, Precision p) {
  return (p == Precision::bf16 ? x.to(torch::kBFloat16) : x).to(torch::kDouble);
}

// max |got - want| / max |want|
double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return (got.to(torch::kDouble) - want).abs().max().item<double>() /
         want.abs().max().item<double>();
}

// Products accumulate in fp32 on both paths: K <= 1024 terms of similar size leave a
// relative error of a few 1e-7 (measured up to 6e-7 here); 4e-6 leaves a margin and still
// fails on a wrong layout or a dropped block (errors of order 1).
constexpr double kFp32Accumulation = 4e-6;

// bf16 also through its fallback (an fp32 GEMM of the rounded inputs, what a CPU without
// AVX-512 runs): the same products up to the order of fp32 sums.
TEST(Matmul, EveryLayoutAndSplitAgreesWithAFloat64Product) {
  for (const int threads : {1, 2}) {    // 2: the output split over two cores
    for (const int path : {0, 1, 2}) {  // fp32, bf16, bf16 through the fallback
      const Precision p = path == 0 ? Precision::fp32 : Precision::bf16;
      const test::PlanScope compute(p, MatmulBackend::onednn, threads);
      force_bf16_gemm_fallback(path == 2);
      torch::manual_seed(3);
      struct Case {
        const char* name;
        int64_t M, K, N;
      };
      for (const Case c :
           {Case{"tall", 300, 96, 40}, Case{"wide", 20, 64, 700}, Case{"one row", 1, 64, 130},
            Case{"one column", 90, 32, 1}, Case{"long sum", 64, 1024, 48}}) {
        SCOPED_TRACE(std::string(c.name) + (path == 0 ? " fp32" : " bf16") +
                     (path == 2 ? " fallback" : "") + " threads " + std::to_string(threads));
        const torch::Tensor a = torch::randn({c.M, c.K}), b = torch::randn({c.K, c.N});
        const torch::Tensor want = rounded(a, p).mm(rounded(b, p));
        // Plain, both transposed views, and column ranges of wider buffers (row stride >
        // columns) for a, b and the output.
        EXPECT_LT(relative_error(matmul(a, b, compute.products()), want), kFp32Accumulation);
        const torch::Tensor at = a.t().contiguous().t(), bt = b.t().contiguous().t();
        EXPECT_LT(relative_error(matmul(at, bt, compute.products()), want), kFp32Accumulation);
        const torch::Tensor wide_a = torch::randn({c.M, c.K + 7}),
                            wide_b = torch::randn({c.K, c.N + 5});
        wide_a.narrow(1, 3, c.K).copy_(a);
        wide_b.narrow(1, 2, c.N).copy_(b);
        torch::Tensor out = torch::full({c.M, c.N + 9}, 7.0f);
        matmul_into(out.narrow(1, 4, c.N), wide_a.narrow(1, 3, c.K), wide_b.narrow(1, 2, c.N),
                    compute.products());
        EXPECT_LT(relative_error(out.narrow(1, 4, c.N), want), kFp32Accumulation);
        EXPECT_TRUE(out.narrow(1, 0, 4).eq(7).all().item<bool>()) << "wrote left of the view";
        EXPECT_TRUE(out.narrow(1, 4 + c.N, 5).eq(7).all().item<bool>()) << "wrote right of it";
      }
    }
  }
  force_bf16_gemm_fallback(false);
}

// minimind-bench --breakdown's products alone: the log counts what each core ran, by shape
// and part, one log at a time, and nothing once it is gone.
TEST(Matmul, ProductLogCountsEachCoresProductsByShapeAndPart) {
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(name_of(p));
    const test::PlanScope compute(p, MatmulBackend::onednn, 2);
    // [300, 40] outputs: split by rows when OpenBLAS gives the products two cores.
    const int64_t cores = std::max(1, blas_threads()), rows = 300 / cores;
    const torch::Tensor a = torch::randn({300, 64}), b = torch::randn({64, 40}),
                        w = torch::randn({40, 64});
    std::map<ProductShape, int64_t> counts;
    std::map<ProductShape, ProductTally> tallies;
    double wall = 0;
    {
      const ProductLog log;
      EXPECT_THROW(ProductLog(), c10::Error);
      const Stopwatch clock;
      matmul(a, b, compute.products());
      matmul(a, b, compute.products());
      in_part(StepPart::attention, [&] { matmul(a, w.t(), compute.products()); });
      wall = clock.seconds();
      counts = log.counts();
      tallies = log.tallies();
    }
    // Each shape's calls timed in the kernel: some time, no more than the cores had.
    double seconds = 0;
    for (const auto& [shape, t] : tallies) {
      EXPECT_EQ(t.count, counts[shape]);
      EXPECT_GT(t.seconds, 0);
      seconds += t.seconds;
    }
    EXPECT_LE(seconds, wall * cores);
    matmul(a, b, compute.products());  // no log: not counted (the next log starts empty)
    // w.t() is read in place in fp32 ('T'); bf16 rounds it into a packed copy.
    const char tb = p == Precision::fp32 ? 'T' : 'N';
    // Without oneDNN's bf16 GEMM (a CPU without AVX-512) a bf16 product runs, and is logged,
    // as the fp32 GEMM of its rounded inputs.
    const Precision ran = bf16_gemm_native() ? p : Precision::fp32;
    const std::map<ProductShape, int64_t> want = {
        {{StepPart::step, ran, 'N', 'N', rows, 40, 64}, 2 * cores},
        {{StepPart::attention, ran, 'N', tb, rows, 40, 64}, cores}};
    EXPECT_TRUE(counts == want);
    const ProductLog again;
    EXPECT_TRUE(again.counts().empty());
  }
}

TEST(Matmul, TimesAProductAloneOnOneCore) {
  const int threads_before = blas_threads();
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    const test::PlanScope compute(p, MatmulBackend::onednn, 2);
    ProductShape shape{StepPart::product_forward, p, 'N', 'T', 96, 48, 32};
    EXPECT_DOUBLE_EQ(shape.flops(), 2.0 * 96 * 48 * 32);
    const double seconds = time_product_alone(shape);
    EXPECT_GT(seconds, 0);
    EXPECT_TRUE(std::isfinite(seconds));
    shape.k = 0;  // no sums: nothing to time
    EXPECT_EQ(time_product_alone(shape), 0);
  }
  EXPECT_EQ(blas_threads(), threads_before);  // one core while timing, then as before
}

TEST(Matmul, BatchedProductsAgreeWithAFloat64Product) {
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    const test::PlanScope compute(p, MatmulBackend::onednn);
    torch::manual_seed(4);
    const torch::Tensor a = torch::randn({6, 70, 16}), b = torch::randn({6, 16, 90});
    const torch::Tensor want = rounded(a, p).bmm(rounded(b, p));
    EXPECT_LT(relative_error(batched_matmul(a, b, compute.products()), want), kFp32Accumulation);
    EXPECT_LT(relative_error(batched_matmul(a, b.transpose(1, 2).contiguous().transpose(1, 2),
                                            compute.products()),
                             want),
              kFp32Accumulation);
  }
}

// q, k and v project one input: it is rounded once. A view of the same memory hits, a
// change in place (the version) or another tensor misses.
TEST(Matmul, RoundsAnActivationOnceForItsProducts) {
  torch::Tensor x = torch::randn({64, 32});
  const torch::Tensor first = to_bf16(x);
  EXPECT_EQ(to_bf16(x).data_ptr(), first.data_ptr());
  EXPECT_EQ(to_bf16(x.reshape({-1, 32})).data_ptr(), first.data_ptr());
  EXPECT_NE(to_bf16(x.t()).data_ptr(), first.data_ptr());  // another view: its own copy
  x.add_(1);
  const torch::Tensor after = to_bf16(x);
  EXPECT_NE(after.data_ptr(), first.data_ptr());
  EXPECT_TRUE(after.equal(x.to(torch::kBFloat16)));
  const torch::Tensor y = x.clone();
  EXPECT_NE(to_bf16(y).data_ptr(), after.data_ptr());
}

TEST(Matmul, RoundsToBf16BitForBitAsTorch) {
  const float inf = std::numeric_limits<float>::infinity();
  torch::Tensor x =
      torch::cat({torch::randn({100000}) * 1e3,
                  torch::tensor({0.0f, -0.0f, inf, -inf, std::nanf(""), 1e-40f, -3e-39f, 3.4e38f,
                                 // ties: 1 + 2^-8 rounds down to even, 1 + 3 * 2^-8 up
                                 1.00390625f, 1.01171875f, -1.00390625f})});
  const torch::Tensor want = x.to(torch::kBFloat16), got = to_bf16(x);
  ASSERT_EQ(got.scalar_type(), torch::kBFloat16);
  // Bits equal except a NaN's, which torch's vectorised and scalar conversions already
  // write differently (0xffff, 0x7fc0): a NaN only has to stay a NaN.
  const torch::Tensor nan = x.isnan();
  EXPECT_TRUE(got.isnan().equal(nan));
  const torch::Tensor w = want.view(torch::kShort).masked_fill(nan, 0),
                      g = got.view(torch::kShort).masked_fill(nan, 0);
  EXPECT_TRUE(w.eq(g).all().item<bool>())
      << "first difference at " << w.ne(g).nonzero()[0].item<int64_t>();
  // A transposed view is rounded as its values, not its storage order.
  const torch::Tensor m = torch::randn({33, 17});
  EXPECT_TRUE(to_bf16(m.t()).to(torch::kFloat).equal(m.t().to(torch::kBFloat16).to(torch::kFloat)));
}

TEST(Matmul, AParametersCopyIsKeptUntilTheParameterChanges) {
  torch::Tensor w = torch::randn({8, 4});
  const torch::Tensor first = to_bf16(w, /*parameter=*/true);
  EXPECT_EQ(to_bf16(w, true).data_ptr(), first.data_ptr()) << "rounded twice";
  w.add_(1.0f);  // an optimizer step moves the version counter
  const torch::Tensor after = to_bf16(w, true);
  EXPECT_TRUE(after.to(torch::kFloat).equal(w.to(torch::kBFloat16).to(torch::kFloat)));
  EXPECT_FALSE(after.to(torch::kFloat).equal(first.to(torch::kFloat)));
}

// An expert's gate and up weights as one rounded copy: each part rounded as torch rounds it,
// stacked in order; kept while neither changes, made anew when either does.
TEST(Matmul, AStackedCopyIsThePartsRoundedAndKeptUntilOneChanges) {
  torch::Tensor gate = torch::randn({6, 4}), up = torch::randn({3, 4});
  const torch::Tensor first = to_bf16_cat({gate, up});
  ASSERT_EQ(first.sizes(), (std::vector<int64_t>{9, 4}));
  EXPECT_EQ(first.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(first.equal(torch::cat({gate, up}).to(torch::kBFloat16)));
  EXPECT_EQ(to_bf16_cat({gate, up}).data_ptr(), first.data_ptr()) << "rounded twice";
  up.mul_(2.0f);  // the second part's version moves
  const torch::Tensor after = to_bf16_cat({gate, up});
  EXPECT_NE(after.data_ptr(), first.data_ptr());
  EXPECT_TRUE(after.equal(torch::cat({gate, up}).to(torch::kBFloat16)));
}

// The trainer's AdamW writes the weights through their pointers; the rounded copy must not
// survive the step (it did: a bf16 run trained on its initial weights and never learned).
TEST(Matmul, AnOptimizerStepMakesTheCopyStale) {
  torch::Tensor w = torch::randn({16, 8}).requires_grad_();
  const torch::Tensor before = to_bf16(w, true).to(torch::kFloat);
  w.mutable_grad() = torch::randn({16, 8});
  auto opt = make_optimizer({w}, TrainConfig{});
  opt->step();
  const torch::Tensor after = to_bf16(w, true).to(torch::kFloat);
  EXPECT_FALSE(after.equal(before));
  EXPECT_TRUE(after.equal(w.detach().to(torch::kBFloat16).to(torch::kFloat)));
}

// project() and batched_product(): forward and both backward products on the chosen path
// equal float64 autograd of the same (rounded) operands. bf16 also rounds the incoming
// gradient, so the backward is compared at bf16's resolution: 2^-8 relative per operand, a
// few of them per product.
TEST(Matmul, ProjectionAndAttentionProductsBackwardOnTheSamePath) {
  for (const Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(p == Precision::bf16 ? "bf16" : "fp32 on oneDNN");
    const test::PlanScope compute(p, MatmulBackend::onednn);
    const double tol = p == Precision::bf16 ? 2e-2 : kFp32Accumulation;
    torch::manual_seed(5);
    const torch::Tensor x0 = torch::randn({3, 50, 24}), w0 = torch::randn({40, 24});
    const torch::Tensor g = torch::randn({3, 50, 40});
    torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    const torch::Tensor y = project(x, w, compute.products());
    y.backward(g);
    torch::Tensor xd = rounded(x0, p).requires_grad_(), wd = rounded(w0, p).requires_grad_();
    const torch::Tensor yd = torch::linear(xd, wd);
    yd.backward(g.to(torch::kDouble));
    EXPECT_LT(relative_error(y, yd), kFp32Accumulation);
    EXPECT_LT(relative_error(x.grad(), xd.grad()), tol);
    EXPECT_LT(relative_error(w.grad(), wd.grad()), tol);

    const torch::Tensor a0 = torch::randn({2, 3, 20, 8}), b0 = torch::randn({2, 3, 8, 30});
    const torch::Tensor gc = torch::randn({2, 3, 20, 30});
    torch::Tensor a = a0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    const torch::Tensor c = batched_product(a, b, compute.products());
    c.backward(gc);
    torch::Tensor ad = rounded(a0, p).requires_grad_(), bd = rounded(b0, p).requires_grad_();
    const torch::Tensor cd = torch::matmul(ad, bd);
    cd.backward(gc.to(torch::kDouble));
    EXPECT_LT(relative_error(c, cd), kFp32Accumulation);
    EXPECT_LT(relative_error(a.grad(), ad.grad()), tol);
    EXPECT_LT(relative_error(b.grad(), bd.grad()), tol);
  }
}

TEST(Matmul, Bf16IsRefusedWithoutBf16InstructionsUnlessEmulationIsAsked) {
  const CpuFeatures old = parse_cpu_features(
      "model name\t: Intel(R) Xeon(R) CPU E5-2680 v4\nflags\t\t: fpu sse2 avx avx2 fma\n");
  ASSERT_FALSE(old.bf16());
  const std::string msg = test::error_of<ConfigError>([&] { check_bf16_cpu(old, false); });
  EXPECT_NE(msg.find("run.precision is bf16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("E5-2680 v4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("emulate"), std::string::npos) << msg;
  EXPECT_NE(msg.find("run.bf16_emulation: true"), std::string::npos) << msg;
  EXPECT_NO_THROW(check_bf16_cpu(old, true));
  const CpuFeatures amd = parse_cpu_features("flags\t\t: avx2 avx512f avx512_bf16\n");
  EXPECT_NO_THROW(check_bf16_cpu(amd, false));
  const CpuFeatures spr = parse_cpu_features("flags\t\t: avx2 avx512f amx_bf16 amx_tile\n");
  EXPECT_NO_THROW(check_bf16_cpu(spr, false));
}

// run.matmul: auto is a rule on the CPU's instruction sets: the same answer on every call,
// however loaded the machine (a timed choice flipped between runs of one config).
TEST(Matmul, AutoIsDecidedByTheCpuNeverByATiming) {
  const CpuFeatures sse = parse_cpu_features("flags\t\t: fpu sse2 sse4_2 avx\n");
  const CpuFeatures avx2 = parse_cpu_features("flags\t\t: fpu sse2 avx avx2 fma\n");
  const CpuFeatures avx512 = parse_cpu_features("flags\t\t: avx2 avx512f avx512bw avx512_bf16\n");
  EXPECT_EQ(auto_matmul(sse), MatmulBackend::openblas);
  EXPECT_EQ(auto_matmul(avx2), MatmulBackend::onednn);
  EXPECT_EQ(auto_matmul(avx512), MatmulBackend::onednn);
  const Config cfg;  // run.matmul: auto
  const ComputePlan first = plan_compute(cfg, this_machine(), {});
  for (int i = 0; i < 20; ++i) {
    const ComputePlan again = plan_compute(cfg, this_machine(), {});
    EXPECT_EQ(again.matmul, first.matmul);
    EXPECT_EQ(again.describe(), first.describe());
  }
  EXPECT_EQ(first.matmul, auto_matmul(cpu_features()));
  EXPECT_NE(first.describe().find("(run.matmul: auto, "), std::string::npos) << first.describe();
}

}  // namespace
}  // namespace minimind
