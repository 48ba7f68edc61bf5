// minimind-export: a checkpoint as a GGUF file (llama.cpp) or a Hugging Face directory.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <map>

#include "command_line.h"
#include "minimind/compute_plan.h"
#include "minimind/error.h"
#include "minimind/eval/eval_inputs.h"
#include "minimind/export/export_model.h"
#include "minimind/util/blas_check.h"

int main(int argc, char** argv) {
  minimind::use_kernels_fitting_the_cpu(argv);  // may re-execute: before anything else
  CLI::App app{
      "minimind-export: write a checkpoint as a GGUF file for llama.cpp, or as a "
      "Hugging Face directory (docs/export.md)"};
  std::string path, out, config, tokenizer;
  minimind::ExportFormat format = minimind::ExportFormat::gguf;
  minimind::ExportDtype dtype = minimind::ExportDtype::f32;
  bool overwrite = false;
  app.add_option("PATH", path,
                 "checkpoint directory, run directory (its newest checkpoint), or MiniMind .pth "
                 "(with --config)")
      ->required();
  app.add_option("--format", format, "gguf (llama.cpp) or hf (a Hugging Face directory)")
      ->required()
      ->transform(CLI::CheckedTransformer(std::map<std::string, minimind::ExportFormat>{
          {"gguf", minimind::ExportFormat::gguf}, {"hf", minimind::ExportFormat::hf}}));
  app.add_option("--out", out, "the .gguf file or the directory to write")->required();
  app.add_option("--dtype", dtype, "f32 (default), f16 or bf16: the weight matrices' type")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, minimind::ExportDtype>{{"f32", minimind::ExportDtype::f32},
                                                       {"f16", minimind::ExportDtype::f16},
                                                       {"bf16", minimind::ExportDtype::bf16}}));
  app.add_flag("--overwrite", overwrite, "replace an existing --out");
  app.add_option("--config", config, "YAML config (required for a bare .pth)");
  app.add_option("--tokenizer", tokenizer,
                 "sentencepiece .model or Hugging Face tokenizer.json (default: the run's own)");
  if (const int status = minimind_app::parse_command_line(app, argc, argv); status >= 0)
    return status;
  minimind_app::use_console_logger("minimind-export");
  return minimind::run_main([&] {
    // No products here: the plan gives the weight conversions their threads.
    minimind::EvalCompute how;
    how.work.products = false;
    const minimind::EvalModel m = minimind::load_eval_model(path, config, tokenizer, true, how);
    spdlog::info("loaded {}", m.weights);
    const minimind::ComputePlan& plan = m.plan;
    const minimind::ComputeScope compute(plan);
    spdlog::info("{}", plan.describe());
    minimind::export_model(m, format, dtype, out, overwrite);
    const auto bytes = std::filesystem::is_directory(out) ? 0 : std::filesystem::file_size(out);
    if (format == minimind::ExportFormat::gguf)
      spdlog::info("wrote {} ({}, architecture {}, {:.1f} MB)", out,
                   dtype == minimind::ExportDtype::f32   ? "f32"
                   : dtype == minimind::ExportDtype::f16 ? "f16"
                                                         : "bf16",
                   minimind::gguf_architecture(m.config.model), bytes / 1e6);
    else
      spdlog::info("wrote {}/ ({})", out.substr(0, out.find_last_not_of('/') + 1),
                   minimind::hf_architecture(m.config.model));
    return 0;
  });
}
