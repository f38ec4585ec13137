// What a step costs, predicted from its shape and learned from the steps the
// workers actually run. Every SLO decision of the scheduler asks this model
// (scheduler/step_dispatcher.h, scheduler/slo_path.h): when a paced decode
// step must start, how large a prompt chunk fits a stream's slack, and which
// path keeps a request within its budget.
//
// The formula, in milliseconds of compute:
//
//   t = fixed + per_token * R(tokens)
//       + per_kilo_read * (reads - shared_reads) / 1000
//       + per_kilo_shared_read * shared_reads / 1000
//
// where `tokens` are the rows the step computes (decode rows, drafted rows,
// prompt tokens) and `reads` the KV positions its attention reads, summed
// over rows (a row at position p reads p + 1). `fixed` is the pass over the
// weights that every step pays once, `per_token` the arithmetic per row, and
// the read terms attention's part, which grows with the contexts. A
// sequence's first row in a step streams its KV from memory; its other rows
// (drafts being verified, the rest of a prompt chunk) read the same KV again
// while it is in cache, which costs arithmetic rather than bandwidth: those
// are `shared_reads`, with a coefficient of their own.
//
// R is the backend's row curve (RowCurve): a product's cost is not linear in
// its rows for small counts (on the CPU, up to 2 rows cost about what one
// does, and in bf16 and f32 each tile of up to 8 rows decodes each weight
// once for all of its rows, so the cost steps where a tile ends (8/9, 16/17;
// f32 takes dequantized panels from 17 rows); q8's tiles are of 4 rows). It
// is measured once at start-up (a step of one sequence at each of a few
// widths up to 32 rows) and scaled to R(1) = 1, R(widest) = widest, so
// the fitted per_token keeps its meaning and R is the identity past the
// widest width measured. Its shape is the kernels'; the fit below follows
// the machine's speed. Without a measurement R is the identity.
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
// fit itself is unconstrained (least squares stays stable only so);
// predictions and the reported coefficients take each coefficient at or
// above zero (a longer chunk never predicts faster), and a prediction at
// or above kMinStepMs. Its error on recent steps (the mean of
// |predicted - measured| / measured over the last kErrorWindow steps, each
// predicted before it was learned from) is reported as a metric.
//
// Thread safety: none; owned by the scheduler thread (or a test).
#ifndef TANDEM_SCHEDULER_STEP_TIME_MODEL_H_
#define TANDEM_SCHEDULER_STEP_TIME_MODEL_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "engine/step/step_plan.h"

namespace tandem::scheduler {

// A step's shape, as the cost model sees it.
struct StepShape {
  int64_t tokens = 0;       // rows computed: prompt tokens, decode tokens, drafts
  double reads = 0;         // KV positions read by attention, summed over rows
  double shared_reads = 0;  // those of `reads` by rows after their sequence's first

  // Adds `rows` consecutive rows of one sequence starting at `first_position`
  // (its first rows in the step).
  void AddRows(int64_t first_position, int64_t rows);
  // Adds rows that follow rows of the same sequence already in the shape
  // (drafts after a decode token): all their reads are shared.
  void AddFollowingRows(int64_t first_position, int64_t rows);
  // A planned step (drafts at their limit), or, with its result, the step
  // as it ran (the drafts the proposer made).
  static StepShape Of(const step::StepPlan& plan, const step::StepResult* result = nullptr);
};

struct StepTimeCoefficients {
  double fixed = 5.0;                 // ms per step
  double per_token = 0.5;             // ms per row
  double per_kilo_read = 0.0;         // ms per 1,000 KV positions a sequence's first row reads
  double per_kilo_shared_read = 0.0;  // ms per 1,000 read by its other rows
};

// Effective rows R(n) of a step of n rows (see above).
class RowCurve {
 public:
  struct Timing {
    int32_t rows = 0;
    double ms = 0;
  };
  // The identity.
  RowCurve() = default;
  // From steps of one sequence at several widths (at context 0). Needs the
  // width 1 and one wider; otherwise, or with times that do not grow with
  // the width, the identity. Between measured widths R is interpolated
  // linearly, and it never decreases.
  explicit RowCurve(std::vector<Timing> timings);

  double operator()(int64_t rows) const;
  // Past this the curve is the identity (0: the identity everywhere).
  int32_t widest() const { return std::max(static_cast<int32_t>(effective_.size()) - 1, 0); }
  // "1:1.00 2:1.08 3:1.9 ..." for the start-up log.
  std::string Describe() const;

 private:
  std::vector<double> effective_;  // [n] for n in 0..widest
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

  // The shape of the backend's products; kept by Reset and Calibrate.
  void SetRowCurve(RowCurve curve) { curve_ = std::move(curve); }
  const RowCurve& row_curve() const { return curve_; }

  double PredictMs(const StepShape& shape) const;
  // Learns from a step that took `measured_ms` of compute (once frozen, only
  // its error is counted).
  void Observe(const StepShape& shape, double measured_ms);
  // Keeps the coefficients as they are (tests and measurements that need a
  // known model).
  void Freeze() { frozen_ = true; }

  StepTimeCoefficients coefficients() const;
  // Mean relative error over the last kErrorWindow observed steps (0 before any).
  double recent_error() const;
  int64_t observed_steps() const { return observed_; }

 private:
  static constexpr size_t kFeatures = 4;
  using Vector = std::array<double, kFeatures>;
  Vector Features(const StepShape& shape) const;
  void ResetConfidence();

  RowCurve curve_;
  Vector theta_{};
  std::array<Vector, kFeatures> covariance_{};
  std::deque<double> errors_;
  double error_sum_ = 0;
  double bias_ = 0;  // a running mean of the signed relative error
  int64_t observed_ = 0;
  bool frozen_ = false;
};

// The formula with its coefficients and a recent error, for logs and
// GetModelInfo: "t = 4.812 ms + 0.5731 ms/token + 0.0104 ms/1k positions read
// + 0.0021 ms/1k read again (error 6.2%)".
std::string DescribeStepTime(const StepTimeCoefficients& c, double recent_error);

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_STEP_TIME_MODEL_H_
