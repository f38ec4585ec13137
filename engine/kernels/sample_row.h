// Sampling one token from a row of logits: the definition every backend
// implements bit for bit (Backend::SampleRows), on the host.
//
// With temperature T > 0, each token has the integer weight w_i of
// sampling_arithmetic.h. The tokens are ranked by logit (larger first, the
// lower id first among equal logits); top_k keeps the first k; top_p then
// keeps the shortest ranked prefix whose weight reaches
// NucleusMass(top_p, Z), Z the kept weight. That prefix is the nucleus, of
// weight Z_N; the token drawn is the first, in id order, whose cumulative
// nucleus weight exceeds DrawTarget(u, Z_N). Everything after the weights is
// integer arithmetic, so any order of summation gives the same token.
#ifndef TANDEM_ENGINE_KERNELS_SAMPLE_ROW_H_
#define TANDEM_ENGINE_KERNELS_SAMPLE_ROW_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "engine/kernels/sampling_arithmetic.h"

namespace tandem::kernels {

// The tokens a sampled draw can return, with their weights.
struct Nucleus {
  std::vector<int32_t> ids;       // ascending
  std::vector<uint64_t> weights;  // w of each id
  uint64_t mass = 0;              // the sum of `weights`, > 0
};

// The largest logit's id, the lowest among equal ones (NaNs never win; a row
// with nothing larger than -inf gives 0).
int32_t ArgMax(std::span<const float> row);

// The nucleus of `row` for a sampled draw (draw.temperature > 0; u unused).
// REQUIRES a non-empty row of at most kMaxVocabulary logits without NaN.
Nucleus NucleusOf(std::span<const float> row, const RowDraw& draw);

// The token of `draw` (greedy when draw.temperature <= 0 or the row has one
// logit).
int32_t SampleRow(std::span<const float> row, const RowDraw& draw);

// SampleRow(row, draw), also giving `token`'s share of the draw's
// distribution: its nucleus weight and the nucleus mass for a sampled draw;
// for a greedy one (or a row of one logit) the point mass on the argmax,
// {1, 1} there and {0, 1} elsewhere. REQUIRES 0 <= token < row.size().
int32_t SampleRowWithShare(std::span<const float> row, const RowDraw& draw, int32_t token,
                           NucleusShare* share);

// Log-probabilities under the row's log-softmax (the model's distribution,
// before temperature and cuts), in double precision, rounded to float.
struct RowLogprobs {
  float token = 0.0f;                          // of the token asked about
  std::vector<std::pair<int32_t, float>> top;  // the most likely, in rank order
};
// REQUIRES 0 <= token < row.size(), top >= 0 (at most row.size() are given).
RowLogprobs LogprobsOf(std::span<const float> row, int32_t token, int top);

}  // namespace tandem::kernels

#endif  // TANDEM_ENGINE_KERNELS_SAMPLE_ROW_H_
