#include "scheduler/step_time_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::scheduler {
namespace {

constexpr double kForgetting = 0.97;
// Bounds the covariance: without new evidence in some direction (a decode
// lane sees only decode steps, and without drafts no shared reads)
// forgetting would grow it without end. Each direction is bounded on its
// own, so one that sees no evidence does not shrink the others (scaling
// the whole matrix would cancel their forgetting).
constexpr double kMaxCovarianceDiagonal = 1e6;
// A shift in the machine's speed shows as predictions off in one direction
// step after step: past this mean signed error (an average over about the
// last 4 steps) the fit forgets its confidence and follows the new times.
constexpr double kShiftBias = 0.15;
constexpr double kBiasWeight = 0.25;

}  // namespace

void StepShape::AddRows(int64_t first_position, int64_t rows) {
  if (rows <= 0) return;
  tokens += 1;
  reads += static_cast<double>(first_position) + 1.0;
  AddFollowingRows(first_position + 1, rows - 1);
}

void StepShape::AddFollowingRows(int64_t first_position, int64_t rows) {
  if (rows <= 0) return;
  tokens += rows;
  // Row i (0-based) at position first_position + i reads first_position + i + 1 positions.
  const double read = static_cast<double>(rows) * (static_cast<double>(first_position) +
                                                   (static_cast<double>(rows) + 1.0) / 2.0);
  reads += read;
  shared_reads += read;
}

RowCurve::RowCurve(std::vector<Timing> timings) {
  std::erase_if(timings, [](const Timing& t) { return !std::isfinite(t.ms) || t.rows < 1; });
  std::sort(timings.begin(), timings.end(),
            [](const Timing& a, const Timing& b) { return a.rows < b.rows; });
  if (timings.size() < 2 || timings.front().rows != 1) return;
  const Timing one = timings.front(), widest = timings.back();
  if (widest.rows <= 1 || !(widest.ms > one.ms) || !std::isfinite(widest.ms)) return;
  // Scaled so that R(1) = 1 and R(widest) = widest.
  const double ms_per_row = (widest.ms - one.ms) / static_cast<double>(widest.rows - 1);
  effective_.assign(static_cast<size_t>(widest.rows) + 1, 0.0);
  effective_[1] = 1.0;
  for (size_t t = 1; t < timings.size(); ++t) {
    const Timing& a = timings[t - 1];
    const Timing& b = timings[t];
    if (b.rows == a.rows) continue;
    const double ra = effective_[static_cast<size_t>(a.rows)];
    const double rb = b.rows == widest.rows ? static_cast<double>(widest.rows)
                                            : std::clamp(1.0 + (b.ms - one.ms) / ms_per_row, ra,
                                                         static_cast<double>(widest.rows));
    for (int32_t n = a.rows + 1; n <= b.rows; ++n) {
      effective_[static_cast<size_t>(n)] =
          ra + (rb - ra) * static_cast<double>(n - a.rows) / static_cast<double>(b.rows - a.rows);
    }
  }
}

double RowCurve::operator()(int64_t rows) const {
  if (rows >= 0 && rows < static_cast<int64_t>(effective_.size())) {
    return effective_[static_cast<size_t>(rows)];
  }
  return static_cast<double>(rows);
}

std::string RowCurve::Describe() const {
  if (effective_.empty()) return "the identity";
  std::string out;
  for (int32_t n : {1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 24, 32, 48, 64}) {
    if (n > widest()) break;
    absl::StrAppendFormat(&out, "%s%d:%.2f", out.empty() ? "" : " ", n, (*this)(n));
  }
  return out;
}

StepShape StepShape::Of(const step::StepPlan& plan, const step::StepResult* result) {
  StepShape shape;
  const bool ran = result != nullptr && result->sequences.size() == plan.sequences.size();
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const step::SequenceStep& s = plan.sequences[i];
    const int32_t drafts = ran ? result->sequences[i].drafted : s.draft_limit;
    shape.AddRows(s.first_position, static_cast<int64_t>(s.tokens.size()) + drafts);
  }
  return shape;
}

StepTimeModel::StepTimeModel(StepTimeCoefficients prior) { Reset(prior); }

void StepTimeModel::ResetConfidence() {
  // The prior's weight: about as much as a few steps' evidence, in the
  // units of the relative-error rows (features divided by the step's time).
  for (auto& row : covariance_) row.fill(0.0);
  covariance_[0][0] = 1e3;
  covariance_[1][1] = 1e2;
  covariance_[2][2] = 1e2;
  covariance_[3][3] = 1e2;
  bias_ = 0;
}

void StepTimeModel::Reset(const StepTimeCoefficients& prior) {
  theta_ = {prior.fixed, prior.per_token, prior.per_kilo_read, prior.per_kilo_shared_read};
  ResetConfidence();
  errors_.clear();
  error_sum_ = 0;
  observed_ = 0;
}

StepTimeCoefficients StepTimeModel::FromTwoSteps(double decode_ms, double chunk_ms,
                                                 int32_t chunk_tokens) {
  StepTimeCoefficients c;
  if (chunk_tokens > 1 && chunk_ms > decode_ms && decode_ms > 0) {
    c.per_token = (chunk_ms - decode_ms) / static_cast<double>(chunk_tokens - 1);
    c.fixed = std::max(decode_ms - c.per_token, kMinStepMs);
  } else if (decode_ms > 0) {
    c.fixed = decode_ms;
  }
  return c;
}

void StepTimeModel::Calibrate(double decode_ms, double chunk_ms, int32_t chunk_tokens) {
  Reset(FromTwoSteps(decode_ms, chunk_ms, chunk_tokens));
  // The two measurements are the first evidence.
  StepShape decode;
  decode.AddRows(0, 1);
  StepShape chunk;
  chunk.AddRows(0, chunk_tokens);
  if (decode_ms > 0) Observe(decode, decode_ms);
  if (chunk_ms > 0 && chunk_tokens > 0) Observe(chunk, chunk_ms);
  errors_.clear();
  error_sum_ = 0;
  observed_ = 0;
}

StepTimeModel::Vector StepTimeModel::Features(const StepShape& shape) const {
  return {1.0, curve_(shape.tokens), (shape.reads - shape.shared_reads) / 1000.0,
          shape.shared_reads / 1000.0};
}

double StepTimeModel::PredictMs(const StepShape& shape) const {
  const Vector x = Features(shape);
  double t = 0;
  for (size_t i = 0; i < x.size(); ++i) t += std::max(theta_[i], 0.0) * x[i];
  return std::max(t, kMinStepMs);
}

void StepTimeModel::Observe(const StepShape& shape, double measured_ms) {
  if (!(measured_ms > 0) || !std::isfinite(measured_ms)) return;
  const double predicted = PredictMs(shape);
  const double error = std::abs(predicted - measured_ms) / measured_ms;
  errors_.push_back(error);
  error_sum_ += error;
  if (errors_.size() > kErrorWindow) {
    error_sum_ -= errors_.front();
    errors_.pop_front();
  }
  ++observed_;
  if (frozen_) return;
  // One step of weighted recursive least squares: the row and the target
  // divided by the measured time (relative error), target 1.
  Vector x = Features(shape);
  for (double& v : x) v /= measured_ms;
  // The shift detector follows the fit's own prediction (unclamped): a
  // coefficient the fit holds below zero is no shift in the machine's speed.
  double fitted = 0;
  for (size_t i = 0; i < kFeatures; ++i) fitted += theta_[i] * x[i];
  bias_ += kBiasWeight * ((fitted - 1.0) - bias_);
  if (std::abs(bias_) > kShiftBias) ResetConfidence();

  Vector px{};
  for (size_t i = 0; i < kFeatures; ++i) {
    for (size_t j = 0; j < kFeatures; ++j) px[i] += covariance_[i][j] * x[j];
  }
  double denominator = kForgetting;
  for (size_t i = 0; i < kFeatures; ++i) denominator += x[i] * px[i];
  double residual = 1.0;
  for (size_t i = 0; i < kFeatures; ++i) residual -= theta_[i] * x[i];
  Vector gain{};
  for (size_t i = 0; i < kFeatures; ++i) gain[i] = px[i] / denominator;
  // The fit itself is unconstrained: clamping its coefficients here (a
  // projection that ignores the covariance) fed back into the next
  // residuals and ran away, on exact step times, once a coefficient whose
  // truth is zero leaned below it (tests/unit/step_time_model_test.cc).
  // Predictions and reports use the coefficients clamped at zero.
  for (size_t i = 0; i < kFeatures; ++i) theta_[i] += gain[i] * residual;
  for (size_t i = 0; i < kFeatures; ++i) {
    for (size_t j = 0; j < kFeatures; ++j) {
      covariance_[i][j] = (covariance_[i][j] - gain[i] * px[j]) / kForgetting;
    }
  }
  // Scaling row and column i by the same factor keeps the matrix positive
  // semi-definite.
  for (size_t i = 0; i < kFeatures; ++i) {
    if (covariance_[i][i] <= kMaxCovarianceDiagonal) continue;
    const double f = std::sqrt(kMaxCovarianceDiagonal / covariance_[i][i]);
    for (size_t j = 0; j < kFeatures; ++j) {
      covariance_[i][j] *= f;
      covariance_[j][i] *= f;
    }
  }
}

StepTimeCoefficients StepTimeModel::coefficients() const {
  return {std::max(theta_[0], 0.0), std::max(theta_[1], 0.0), std::max(theta_[2], 0.0),
          std::max(theta_[3], 0.0)};
}

double StepTimeModel::recent_error() const {
  return errors_.empty() ? 0.0 : error_sum_ / static_cast<double>(errors_.size());
}

std::string DescribeStepTime(const StepTimeCoefficients& c, double recent_error) {
  return absl::StrFormat(
      "t = %.3f ms + %.4f ms/token + %.4f ms/1k positions read + %.4f ms/1k read again (error "
      "%.1f%%)",
      c.fixed, c.per_token, c.per_kilo_read, c.per_kilo_shared_read, 100.0 * recent_error);
}

}  // namespace tandem::scheduler
