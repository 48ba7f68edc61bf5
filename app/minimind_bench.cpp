// minimind-bench: training and generation speed of the C++ model on the fixed bench config
// (hidden 256, 4 layers, 8 heads, 2 kv heads, vocab 6400, seq 256, batch 8, fp32).
// scripts/bench.sh runs it next to the PyTorch reference (tests/reference/bench.py).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <thread>

#include "command_line.h"
#include "minimind/config.h"
#include "minimind/error.h"
#include "minimind/eval/generate.h"
#include "minimind/model/minimind_model.h"
#include "minimind/run/expert_counts.h"
#include "minimind/train/bench.h"
#include "minimind/train/optim.h"
#include "minimind/train/step_breakdown.h"
#include "minimind/train/train_step.h"
#include "minimind/util/allocator.h"
#include "minimind/util/blas_check.h"
#include "minimind/util/matmul.h"
#include "minimind/util/matmul_peak.h"
#include "minimind/util/output_path.h"
#include "minimind/util/step_part.h"
#include "minimind/util/stopwatch.h"

namespace {

// The first event of every trace --profile writes (a Chrome trace metadata record naming the
// process): the mark by which a later --profile knows the file as its own to replace.
constexpr std::string_view kTraceMark =
    R"({"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "minimind-bench --profile"}})";

// Whether a file's first bytes are those of a trace --profile wrote: what it may replace.
// Another program's trace, however alike, is not (it carries no mark).
bool is_own_trace(std::string_view head) {
  const size_t start = head.find_first_not_of(" \n");
  return start != std::string_view::npos && head.substr(start, 1) == "[" &&
         head.substr(start + 1, kTraceMark.size()) == kTraceMark;
}

// The legacy profiler's trace at `path` (a JSON array) with kTraceMark as its first event.
void mark_trace(const std::string& path) {
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const size_t open = text.find('[');
  if (open == std::string::npos)
    throw minimind::Error("--profile: the profiler wrote no JSON array to '" + path + "'");
  const bool empty = text.find_first_not_of(" \n\r\t", open + 1) == std::string::npos ||
                     text[text.find_first_not_of(" \n\r\t", open + 1)] == ']';
  text.insert(open + 1, std::string(kTraceMark) + (empty ? "" : ",\n"));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush())
    throw minimind::Error("--profile: cannot write '" + path + "': " + std::strerror(errno));
}

// OpenBLAS's fp32 peak under the kernel sets this CPU can run other than the loaded one:
// the kernels are chosen when the library loads, so each is measured by this program run
// again with OPENBLAS_CORETYPE set (--matmul-peaks). The training itself keeps the
// environment's kernels.
std::vector<minimind::MatmulPeak> other_kernel_set_peaks(const minimind::CpuFeatures& cpu) {
  std::vector<minimind::MatmulPeak> out;
  std::vector<std::string> sets;
  if (cpu.avx2) sets.emplace_back("Haswell");
  if (cpu.avx512f) sets.emplace_back("SkylakeX");
  for (const auto& set : sets) {
    if (set == minimind::blas_core_name()) continue;
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::string cmd = "OPENBLAS_CORETYPE=" + set + " '" + self + "' --matmul-peaks";
    FILE* pipe = ::popen(cmd.c_str(), "r");
    std::string text;
    char buf[4096];
    if (pipe)
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) text.append(buf, n);
    if (!pipe || ::pclose(pipe) != 0) {
      spdlog::warn("the {} kernel-set probe ({}) failed; left out of the peaks", set, cmd);
      continue;
    }
    try {
      for (const auto& p : nlohmann::json::parse(text))
        if (p.at("backend") == "openblas")
          out.push_back({"openblas", "fp32", p.at("kernel").get<std::string>() + " (probed)",
                         p.at("gflops").get<double>()});
    } catch (const nlohmann::json::exception&) {
      spdlog::warn("the {} kernel-set probe printed no peaks; left out", set);
    }
  }
  return out;
}

// The --variant table: per variant its products, the median step, tok/s and model GFLOP/s
// relative to the first (the bench config as given).
int print_variants(const minimind::Config& base, const std::vector<std::string>& specs, int steps,
                   int warmup,
                   const std::function<minimind::ComputePlan(const minimind::Config&)>& plan_for) {
  using namespace minimind;
  const std::vector<VariantSpeed> rows = compare_variants(base, specs, steps, warmup, plan_for);
  std::cout << fmt::format(
      "{} variants, {} measured steps each, interleaved\n"
      "| variant | products | threads | step ms | tok/s | model GFLOP/s | per-FLOP speed (MFU) "
      "vs {} |\n"
      "|---|---|---:|---:|---:|---:|---:|\n",
      rows.size(), steps, rows[0].name);
  for (const auto& r : rows)
    std::cout << fmt::format("| {} | {} {} | {} | {:.0f} | {:.0f} | {:.1f} | {:+.1f} % |\n", r.name,
                             name_of(r.plan.precision), name_of(r.plan.matmul), r.plan.threads,
                             1e3 * r.step_seconds, r.tok_s, r.gflops,
                             100 * (r.gflops / rows[0].gflops - 1));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  minimind::use_kernels_fitting_the_cpu(argv);  // may re-execute: before anything else
  CLI::App app{"minimind-bench: C++ training/generation speed on the bench config"};
  std::string preset = "moe-top1";
  int steps = 12, warmup = 3, threads = -1, blas_threads = 0, torch_threads = 0, shards = 0;
  bool json = false;
  std::string profile;
  std::vector<std::string> sets;
  app.add_option("--preset", preset,
                 "dense | moe-top1 | moe-top2 | moe-e16k4 | moe-e64k16 (fine-grained: E experts, "
                 "top-k, each 4/E as wide as moe-top1's, so the same active and total weights)")
      ->check(CLI::IsMember({"dense", "moe-top1", "moe-top2", "moe-e16k4", "moe-e64k16"}));
  std::string config_arg;
  app.add_option("--config", config_arg,
                 "a config file or preset (e.g. minimind-3-moe) in place of the bench config: its "
                 "model, a step of one micro-batch of train.batch_size x data.max_seq_len tokens")
      ->excludes(app.get_option("--preset"));
  app.add_option("--steps", steps, "measured steps (median over them)")
      ->check(minimind_app::integer_in(1, 100000));
  app.add_option("--warmup", warmup, "steps before measuring")
      ->check(minimind_app::integer_in(0, 100000));
  app.add_option("--threads", threads,
                 "cores to use (same as --set run.threads=N; 0 = one per core)")
      ->check(minimind_app::integer_in(0, minimind::kMaxThreads));
  app.add_option("--blas-threads", blas_threads,
                 "OpenBLAS threads while training, in place of the compute plan's (0: the plan's)")
      ->check(minimind_app::integer_in(0, minimind::kMaxThreads));
  app.add_option("--torch-threads", torch_threads,
                 "torch intra-op threads, in place of the compute plan's (0: the plan's)")
      ->check(minimind_app::integer_in(0, minimind::kMaxThreads));
  app.add_option("--shards", shards,
                 "shards of each micro-batch trained side by side, in place of the compute "
                 "plan's (0: the plan's, one per thread; 1: the whole micro-batch at once)")
      ->check(minimind_app::integer_in(0, 8));
  std::string precision, matmul;
  app.add_option("--precision", precision,
                 "the matrix products' precision (same as --set run.precision=P; bf16: bf16 "
                 "inputs, fp32 accumulation)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--matmul", matmul,
                 "the fp32 products' library (same as --set run.matmul=M; auto: oneDNN on an "
                 "AVX2 or AVX-512 CPU, else OpenBLAS)")
      ->check(CLI::IsMember({"auto", "openblas", "onednn"}));
  bool bf16_emulation = false;
  app.add_flag("--bf16-emulation", bf16_emulation,
               "run bf16 on a CPU without bf16 instructions (same as --set "
               "run.bf16_emulation=true)");
  app.add_option("--profile", profile,
                 "write a Chrome trace (chrome://tracing, Perfetto) of one measured step");
  int breakdown = 0;
  app.add_option("--breakdown", breakdown,
                 "after the measured steps, profile N more and print where their time goes: "
                 "each part's exclusive time (products, attention, norms, ..., autograd, "
                 "allocation), their mean over the N steps; then each of their products "
                 "timed again alone, and the MFU that speed allows (docs/performance.md)")
      ->expected(0, 1)
      ->default_str("3")
      ->check(minimind_app::integer_in(1, 1000));
  app.add_option("--set", sets,
                 "SECTION.KEY=VALUE on the bench config, e.g. model.capacity_factor=1.25 "
                 "(repeatable; a balancing method's cost)");
  std::vector<std::string> variants;
  app.add_option("--variant", variants,
                 "NAME:section.key=value,... (repeatable): train these variants of the bench "
                 "config and the config itself in one process, a step of each in turn, and "
                 "print a table of their speed per model FLOP");
  app.add_flag("--json", json, "one JSON line on stdout");
  bool peaks_only = false;
  app.add_flag("--matmul-peaks", peaks_only,
               "only measure the matmul peak of each backend on one core and print them as JSON "
               "(minimind-bench runs itself so under each OpenBLAS kernel set the CPU has)");
  for (const char* other : {"--json", "--profile", "--breakdown"})
    app.get_option("--variant")->excludes(app.get_option(other));
  if (const int status = minimind_app::parse_command_line(app, argc, argv); status >= 0)
    return status;
  minimind_app::use_console_logger("minimind-bench");  // stdout: data only

  // The trace is written beside --profile and put in place whole, so that a run that fails
  // or is stopped leaves what was there as it was.
  std::optional<minimind::OutputReplacement> trace_file;
  return minimind::run_main([&] {
    using namespace minimind;
    // The profiler writes only after the measured step: find out now whether it can.
    if (app.count("--profile") > 0 && profile.empty())
      throw Error("--profile is empty: give the trace's file name");
    if (!profile.empty()) {
      check_own_output_file(profile, "--profile", "a trace minimind-bench writes", is_own_trace);
      trace_file.emplace(profile);
      if (!std::ofstream(trace_file->temp()))
        throw Error("--profile: cannot write '" + profile + "': " + std::strerror(errno));
    }
    if (peaks_only) {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& p : measure_matmul_peaks())
        j.push_back({{"backend", p.backend},
                     {"precision", p.precision},
                     {"kernel", p.kernel},
                     {"gflops", p.gflops}});
      std::cout << j.dump() << "\n";
      return 0;
    }
    // The flags that are spellings of keys, after the --set ones.
    if (!precision.empty()) sets.push_back("run.precision=" + precision);
    if (!matmul.empty()) sets.push_back("run.matmul=" + matmul);
    if (threads >= 0) sets.push_back("run.threads=" + std::to_string(threads));
    if (bf16_emulation) sets.push_back("run.bf16_emulation=true");
    const Config cfg = config_arg.empty() ? bench_config(preset, sets) : [&] {
      const std::string file = find_config_file(config_arg);
      LoadedConfig loaded = load_config(file, sets);
      for (const auto& w : loaded.warnings) spdlog::warn("{}", w);
      preset = std::filesystem::path(file).stem().string();  // the JSON's and table's label
      return loaded.config;
    }();
    const int64_t B = cfg.train.batch_size, T = cfg.data.max_seq_len;
    // The trainer's plan for this config (a training step of the bench batch), with the
    // bench's own experiments (--blas-threads, --torch-threads, --shards) in its place.
    const Machine machine = this_machine();
    auto plan_for = [&](const Config& c) {
      ComputePlan p = plan_compute(c, machine, {true, c.train.batch_size, 1, 1});
      if (blas_threads > 0) p.blas_threads = blas_threads;
      if (torch_threads > 0) p.torch_threads = torch_threads;
      if (shards > 0) p.shards = shards;
      return p;
    };
    const ComputePlan plan = plan_for(cfg);
    const ComputeScope compute(plan);
    spdlog::info("{}", plan.describe());
    const int n_threads = plan.threads;
    const CpuFeatures& cpu = machine.cpu;
    std::vector<MatmulPeak> peaks = measure_matmul_peaks();
    for (const auto& p : other_kernel_set_peaks(cpu)) peaks.push_back(p);
    // No bf16 peak where oneDNN has no bf16 matmul (a CPU without AVX-512): bf16 products,
    // only under run.bf16_emulation there, are fp32 products of rounded inputs.
    const MatmulPeak& fp32 = *best_peak(peaks, "fp32");
    const MatmulPeak* bf16 = best_peak(peaks, "bf16");
    const MatmulPeak& openblas = peaks[0];
    spdlog::info("CPU {}: {}; matmul peak per core: {}", cpu.model, cpu.flags(), [&] {
      std::string s;
      for (const auto& p : peaks)
        s += fmt::format("{}{} {} {:.0f} GFLOP/s ({})", s.empty() ? "" : ", ", p.backend,
                         p.precision, p.gflops, p.kernel);
      return s;
    }());
    if (!bf16)
      spdlog::info(
          "no bf16 products in oneDNN for this CPU (no AVX-512): bf16 runs as fp32 products of "
          "rounded inputs, and its MFU is against the fp32 peak");
    else if (!cpu.bf16())
      spdlog::info("no bf16 instructions (avx512_bf16, amx_bf16): oneDNN emulates bf16 here");
    const Precision prec = plan.precision;
    const std::string precision_name = name_of(prec), fp32_library = name_of(plan.matmul);
    if (!variants.empty()) return print_variants(cfg, variants, steps, warmup, plan_for);

    torch::manual_seed(0);
    MiniMindForCausalLM model(cfg.model, plan.products());
    init_weights(model);
    model->train();
    auto opt = make_optimizer(model->parameters(), cfg.train);
    torch::Tensor ids = torch::randint(3, cfg.model.vocab_size, {B, T}, torch::kLong);

    if (shards > 1 && batch_shards(cfg.model, B, shards) == 1)
      throw ConfigError(
          "--shards " + std::to_string(shards) + ": this config keeps each micro-batch whole",
          "capacity, the random router and dropout rank or draw over the whole "
          "micro-batch; leave --shards out");
    const int n_shards = plan.shards;
    // The trainer's optimizer step on the bench batch: its forward, backward (in shards when
    // it would be), clipping, AdamW and the router bias update.
    StepOptions so;
    so.grad_clip = cfg.train.grad_clip, so.lr = cfg.train.learning_rate, so.shards = n_shards;
    auto train_step = [&] {
      return optimizer_step(
          model, *opt,
          [&] {
            return Batch{ids, ids, {}};
          },
          so);
    };
    std::vector<double> fwd, bwd, optim, total;
    for (int s = 0; s < warmup + steps; ++s) {
      // The legacy autograd profiler records every op of the step, forward and backward.
      std::optional<torch::autograd::profiler::RecordProfile> trace;
      if (trace_file && s == warmup) trace.emplace(trace_file->temp());
      const Stopwatch clock;
      const StepStats st = train_step();
      const double t = clock.seconds();
      if (s >= warmup) {
        fwd.push_back(st.forward_seconds), bwd.push_back(st.micro_seconds - st.forward_seconds);
        optim.push_back(t - st.micro_seconds), total.push_back(t);
      }
      if (trace) {
        trace.reset();  // writes the file
        mark_trace(trace_file->temp());
        trace_file->commit();
        spdlog::info("wrote {} (step {}, profiled: its time is not representative)", profile,
                     s + 1);
      }
    }
    // --breakdown: more steps, each profiled (the profiler slows a step: it is shown apart).
    // Then every product of those steps again, each shape alone on one core.
    std::optional<StepBreakdown> parts;
    std::optional<ProductsAlone> alone;
    if (breakdown > 0) {
      std::vector<StepBreakdown> each;
      std::map<ProductShape, ProductTally> products;
      {
        const ProductLog log;
        for (int s = 0; s < breakdown; ++s) {
          StepRecorder recorder;
          {
            const StepScope whole(StepPart::step);
            train_step();
          }
          each.push_back(break_down_step(recorder.finish(), n_threads));
        }
        products = log.tallies();
      }
      parts = mean_breakdown(each);
      if (!products.empty()) alone = time_products_alone(products, breakdown, *parts);
    }
    const double step = median(total);
    const double tok_s = B * T / step;
    // MFU against the best fp32 product this machine reaches (per core x cores), and for
    // comparison against OpenBLAS with the loaded kernels and against bf16.
    const double model_gflops = tok_s * flops_per_token(cfg.model, T).total() / 1e9;
    const MatmulPeak& peak = prec == Precision::bf16 && bf16 ? *bf16 : fp32;
    const double mfu = model_gflops / (peak.gflops * n_threads);
    const double mfu_fp32 = model_gflops / (fp32.gflops * n_threads);
    const double mfu_openblas = model_gflops / (openblas.gflops * n_threads);
    const double mfu_bf16 = bf16 ? model_gflops / (bf16->gflops * n_threads) : 0;
    // What the products' lone speed allows: the model's FLOPs over the products' lone core
    // time (the rest of the step free), and the profiled step with its product rows at
    // their lone time.
    double mfu_ceiling = 0, mfu_lone = 0;
    if (alone && alone->alone_ms() > 0) {
      const double model_gflop_step = flops_per_token(cfg.model, T).total() * B * T / 1e9;
      mfu_ceiling = model_gflop_step / (alone->alone_ms() * n_threads / 1e3) / peak.gflops;
      mfu_lone = mfu * parts->step_ms / alone->step_ms_at_lone_speed(*parts);
    }
    std::vector<double> rates;
    for (double t : total) rates.push_back(B * T / t);
    const auto [lo, hi] = std::minmax_element(rates.begin(), rates.end());

    // Generation: 128 tokens greedy after a 16-token prompt, with the KV cache.
    model->eval();
    std::vector<int64_t> prompt(ids[0].data_ptr<int64_t>(), ids[0].data_ptr<int64_t>() + 16);
    GenerateOptions g;
    g.max_new_tokens = 128;
    g.greedy = true;
    g.eos_id = -1;
    generate(model, prompt, g);  // warm-up
    const Stopwatch gen_clock;
    const size_t n = generate(model, prompt, g).size();
    const double gen_s = n / gen_clock.seconds();

    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const double rss_mb = ru.ru_maxrss / 1024.0;
    if (json) {
      nlohmann::json j = {{"impl", "cpp"},
                          {"preset", preset},
                          {"set", sets},
                          {"threads", n_threads},
                          {"shards", n_shards},
                          {"tok_s", tok_s},
                          {"tok_s_min", *lo},
                          {"tok_s_max", *hi},
                          {"step_ms", 1e3 * step},
                          {"fwd_ms", 1e3 * median(fwd)},
                          {"bwd_ms", 1e3 * median(bwd)},
                          {"opt_ms", 1e3 * median(optim)},
                          {"peak_rss_mb", rss_mb},
                          {"model_gflops", model_gflops},
                          {"precision", precision_name},
                          {"matmul", fp32_library},
                          {"plan", plan.to_json()},
                          {"mfu", mfu},
                          {"peak_gflops", peak.gflops * n_threads},
                          {"peak_backend", peak.backend + " " + peak.kernel},
                          {"mfu_fp32", mfu_fp32},
                          {"peak_fp32_gflops", fp32.gflops * n_threads},
                          {"mfu_openblas", mfu_openblas},
                          {"cpu", cpu.model},
                          {"cpu_flags", cpu.flags()},
                          {"gen_tok_s", gen_s},
                          {"blas_core", blas_core_name()},
                          {"allocator", allocator_name()}};
      // null where there is no bf16 peak (a CPU without AVX-512)
      j["mfu_bf16"] = bf16 ? nlohmann::json(mfu_bf16) : nlohmann::json();
      j["peak_bf16_gflops"] = bf16 ? nlohmann::json(bf16->gflops * n_threads) : nlohmann::json();
      if (parts) j["breakdown"] = breakdown_json(*parts);
      if (alone)
        j["products_alone"] = products_alone_json(*alone), j["mfu_ceiling"] = mfu_ceiling,
        j["mfu_at_lone_speed"] = mfu_lone;
      std::cout << j.dump() << "\n";
    } else {
      std::cout << fmt::format(
          "{} {}: {:.0f} tok/s (min {:.0f}, max {:.0f}) | step {:.0f} ms = fwd {:.0f} + bwd {:.0f} "
          "+ opt {:.0f} | peak RSS {:.0f} MB | {:.0f} model GFLOP/s: MFU {:.1f}% of the {} peak "
          "{:.0f} GFLOP/s ({} {}), {:.1f}% of OpenBLAS {}'s{} | generation {:.0f} tok/s\n",
          preset, precision_name, tok_s, *lo, *hi, 1e3 * step, 1e3 * median(fwd), 1e3 * median(bwd),
          1e3 * median(optim), rss_mb, model_gflops, 100 * mfu, precision_name,
          peak.gflops * n_threads, peak.backend, peak.kernel, 100 * mfu_openblas, blas_core_name(),
          bf16 ? fmt::format(", {:.1f}% of bf16's", 100 * mfu_bf16) : std::string(), gen_s);
      if (parts)
        std::cout << fmt::format(
                         "\nWhere a step goes ({} profiled steps after the measured ones; "
                         "unprofiled median {:.1f} ms):\n",
                         breakdown, 1e3 * step)
                  << format_breakdown(*parts);
      if (parts && !alone)
        std::cout << "\nThe products ran inside ATen (fp32 on OpenBLAS): not timed alone.\n";
      if (alone)
        std::cout << fmt::format(
                         "\nThe products alone (each product of those steps timed again by "
                         "itself on one core: same kernel, shape and part, operands in cache; "
                         "per step, core time / {} cores):\n",
                         n_threads)
                  << format_products_alone(*alone, peak.gflops)
                  << fmt::format(
                         "MFU at the products' lone speed: {:.1f}% were everything else free, "
                         "{:.1f}% with the rest of the step as profiled.\n",
                         100 * mfu_ceiling, 100 * mfu_lone)
                  << fmt::format(
                         "\nThe products that lose the most in the step, by family (alike but "
                         "for the tokens' dimension; each call timed in the kernel on its core, "
                         "in the step and alone; lost: ms a step, core time / {} cores):\n",
                         n_threads)
                  << format_product_families(*alone, 8);
    }
    return 0;
  });
}
