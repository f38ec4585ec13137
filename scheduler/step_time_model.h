// What a step costs, predicted from its shape and learned from the steps the
// workers actually run. Every SLO decision of the scheduler asks this model
// (scheduler/step_dispatcher.h, scheduler/slo_path.h): when a paced decode
// step must start, how large a prompt chunk fits a stream's slack, and which
// path keeps a request within its budget.
//
// The formula, in milliseconds of compute:
//
//   t = fixed + per_token * tokens + per_kilo_read * reads / 1000
//
// where `tokens` are the rows the step computes (decode rows, drafted rows,
// prompt tokens) and `reads` the KV positions its attention reads, summed
// over rows (a row at position p reads p + 1). `fixed` is the pass over the
// weights that every step pays once, `per_token` the arithmetic per row, and
// `per_kilo_read` attention's part, which grows with the contexts.
//
// Fitting: recursive least squares on the relative error (each step's row
// is divided by its measured time, so a 5 ms decode step counts as much as a
// 300 ms prompt chunk) with exponential forgetting (factor 0.97: a step's
// weight halves after about 23 newer steps), started from a prior
// measured at start-up (Calibrate: a lone decode step and a prompt chunk,
// the three timings the `auto` threshold used) or from defaults. So a change
// in the machine's speed (another tenant, thermal limits) is tracked within a
// few dozen steps; a shift that leaves predictions off in one direction
// for a few steps in a row (a running mean of the signed error past 15%)
// resets the fit's confidence, so it follows within a few steps more. The
// fit keeps each coefficient at or above zero, and a
// prediction at or above kMinStepMs. Its error on recent steps (the mean of
// |predicted - measured| / measured over the last kErrorWindow steps, each
// predicted before it was learned from) is reported as a metric.
//
// Thread safety: none; owned by the scheduler thread (or a test).
#ifndef TANDEM_SCHEDULER_STEP_TIME_MODEL_H_
#define TANDEM_SCHEDULER_STEP_TIME_MODEL_H_

#include <array>
#include <cstdint>
#include <deque>
#include <string>

#include "engine/step/step_plan.h"

namespace tandem::scheduler {

// A step's shape, as the cost model sees it.
struct StepShape {
  int64_t tokens = 0;  // rows computed: prompt tokens, decode tokens, drafts
  double reads = 0;    // KV positions read by attention, summed over rows

  // Adds `rows` consecutive rows of one sequence starting at `first_position`.
  void AddRows(int64_t first_position, int64_t rows);
  // A planned step (drafts at their limit), or, with its result, the step
  // as it ran (the drafts the proposer made).
  static StepShape Of(const step::StepPlan& plan, const step::StepResult* result = nullptr);
};

struct StepTimeCoefficients {
  double fixed = 5.0;          // ms per step
  double per_token = 0.5;      // ms per row
  double per_kilo_read = 0.0;  // ms per 1,000 KV positions read
};

class StepTimeModel {
 public:
  static constexpr double kMinStepMs = 0.05;
  static constexpr size_t kErrorWindow = 64;

  explicit StepTimeModel(StepTimeCoefficients prior = {});

  // The coefficients two measured steps give: `decode_ms` a step of one
  // decode token, `chunk_ms` a step of `chunk_tokens` prompt tokens.
  static StepTimeCoefficients FromTwoSteps(double decode_ms, double chunk_ms, int32_t chunk_tokens);
  // Restarts the fit from those two steps, which are its first evidence.
  void Calibrate(double decode_ms, double chunk_ms, int32_t chunk_tokens);
  // Restarts the fit from `prior`, with no evidence yet.
  void Reset(const StepTimeCoefficients& prior);

  double PredictMs(const StepShape& shape) const;
  // Learns from a step that took `measured_ms` of compute.
  void Observe(const StepShape& shape, double measured_ms);

  StepTimeCoefficients coefficients() const;
  // Mean relative error over the last kErrorWindow observed steps (0 before any).
  double recent_error() const;
  int64_t observed_steps() const { return observed_; }

 private:
  static std::array<double, 3> Features(const StepShape& shape);
  void ResetConfidence();

  std::array<double, 3> theta_{};
  std::array<std::array<double, 3>, 3> covariance_{};
  std::deque<double> errors_;
  double error_sum_ = 0;
  double bias_ = 0;  // a running mean of the signed relative error
  int64_t observed_ = 0;
};

// The formula with its coefficients and a recent error, for logs and
// GetModelInfo: "t = 4.812 ms + 0.5731 ms/token + 0.0104 ms/1k positions read
// (error 6.2%)".
std::string DescribeStepTime(const StepTimeCoefficients& c, double recent_error);

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_STEP_TIME_MODEL_H_
