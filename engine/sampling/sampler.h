// Turns next-token logits into a token, deterministically.
//
// Temperature 0 is greedy (argmax, lowest id on ties). Otherwise each token
// gets an integer weight from its temperature-scaled logit, the vocabulary is
// cut to the top_k most likely (ties broken by lower id) and then to the
// shortest most-likely prefix whose weight reaches top_p of the kept weight,
// and one token is drawn by the inverse CDF in id order with a uniform number
// that depends only on (seed, draw_index). The exact arithmetic is
// kernels::SampleRow (engine/kernels/sample_row.h), which every backend
// implements bit for bit (Backend::SampleRows). So a request's i-th token is
// the same whether it runs alone, batched, chunked, recomputed after
// preemption, or on another device given the same logits.
#ifndef TANDEM_ENGINE_SAMPLING_SAMPLER_H_
#define TANDEM_ENGINE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "engine/kernels/sample_row.h"
#include "engine/step/step_plan.h"

namespace tandem::sampling {

step::TokenId Sample(std::span<const float> logits, const step::SamplingParams& params,
                     uint64_t draw_index);
// Sample() with the uniform number `u` in [0, 1) given.
step::TokenId SampleWithDraw(std::span<const float> logits, const step::SamplingParams& params,
                             double u);

// The backend form of `params` with the uniform number `u`.
kernels::RowDraw RowDrawOf(const step::SamplingParams& params, double u);

// The distribution Sample() draws from, over the whole vocabulary: the
// temperature-scaled softmax cut by top-k and top-p and renormalised (zero
// outside the cut). Greedy params give a point mass on the argmax.
std::vector<float> Probabilities(std::span<const float> logits, const step::SamplingParams& params);

// A token drawn from `probabilities` (need not sum to 1) by the inverse CDF in
// id order at `u`.
step::TokenId DrawFrom(std::span<const float> probabilities, double u);

// Speculative rejection sampling (Leviathan et al., Chen et al., 2023): a
// token x drafted from distribution q is accepted with probability
// min(1, p(x) / q(x)), using the uniform u; when rejected, the replacement is
// drawn from the residual max(0, p - q), renormalised. Together they give a
// token distributed exactly as p, whatever q is.
bool AcceptDraft(std::span<const float> p, std::span<const float> q, step::TokenId x, double u);
// AcceptDraft() given p(x) and q(x) alone.
bool AcceptDraftAt(float p_x, float q_x, double u);
// The probability Probabilities() gives a token from its NucleusShare of
// the same row and params (sample_row.h), bit for bit.
float ShareProbability(const kernels::NucleusShare& share);
step::TokenId DrawResidual(std::span<const float> p, std::span<const float> q, double u);

// The log-probability of `token` and the `top` most likely tokens (ties by
// lower id) under log-softmax(logits), computed in double precision.
step::TokenLogprobs Logprobs(std::span<const float> logits, step::TokenId token, int top);

// The uniform number in [0, 1) of draw `draw_index` for `seed`.
double UniformDraw(uint64_t seed, uint64_t draw_index);

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_SAMPLER_H_
