#include "minimind/train/report_writer.h"

#include <ctime>

#include "minimind/error.h"

namespace minimind {

void ReportWriter::on_start(const RunStart& s) {
  start_ = s;
  started_ = true;
  step_ = s.step, max_steps_ = s.max_steps;
  since_last_.restart();
}

void ReportWriter::on_eval(const EvalInfo& e) {
  if (interval_ <= 0) return;
  step_ = e.record.step;
  write(/*running=*/true);
}

void ReportWriter::on_step_end(const StepInfo& s, bool last) {
  step_ = s.step, max_steps_ = s.max_steps;
  if (interval_ <= 0 || last || since_last_.seconds() < static_cast<double>(interval_)) return;
  write(/*running=*/true);
}

void ReportWriter::on_end(const TrainResult&) {
  write(/*running=*/false);
  if (start_.main_rank && pages_ > 0)
    start_.log->info("report rewritten {} times while training ({:.2f} s in all)", pages_,
                     seconds_live_);
}

void ReportWriter::write(bool running) {
  if (!started_ || !start_.main_rank) return;
  const Stopwatch clock;
  ReportStatus status{step_, max_steps_, "", 60};
  if (running) {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char hhmm[8];
    std::strftime(hhmm, sizeof(hhmm), "%H:%M", &local);
    status.written_at = hhmm;
  }
  try {
    const std::string path = write_report(start_.run_dir, running ? &status : nullptr);
    if (!running) start_.log->info("report {}", path);
  } catch (const Error& e) {
    start_.log->warn("cannot write the report: {}; training goes on", e.what());
  }
  since_last_.restart();
  if (running) seconds_live_ += clock.seconds(), ++pages_;
}

}  // namespace minimind
