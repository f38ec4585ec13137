// Turns next-token logits into a token, deterministically.
//
// Temperature 0 is greedy (argmax, lowest id on ties). Otherwise the logits
// are divided by the temperature, cut to the top_k most likely (ties broken by
// lower id) and then to the smallest prefix whose probability reaches top_p,
// renormalised, and one token is drawn with a uniform number that depends only
// on (seed, draw_index). So a request's i-th token is the same whether it
// runs alone, batched, chunked, or recomputed after preemption.
#ifndef TANDEM_ENGINE_SAMPLING_SAMPLER_H_
#define TANDEM_ENGINE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <span>

#include "engine/step/step_plan.h"

namespace tandem::sampling {

step::TokenId Sample(std::span<const float> logits, const step::SamplingParams& params,
                     uint64_t draw_index);

// The log-probability of `token` and the `top` most likely tokens (ties by
// lower id) under log-softmax(logits), computed in double precision.
step::TokenLogprobs Logprobs(std::span<const float> logits, step::TokenId token, int top);

// The uniform number in [0, 1) of draw `draw_index` for `seed`.
double UniformDraw(uint64_t seed, uint64_t draw_index);

}  // namespace tandem::sampling

#endif  // TANDEM_ENGINE_SAMPLING_SAMPLER_H_
