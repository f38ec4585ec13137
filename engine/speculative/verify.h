// Verification of drafted tokens against the target model's logits.
//
// The step ran the sequence's last token and its k drafted tokens through the
// target, giving k+1 rows of next-token logits: row i follows the last token
// and the first i drafts. Verification walks the rows in order and emits
// tokens until the first disagreement:
//
//  - Greedy (temperature 0): the target's argmax at each row; a draft is
//    accepted while it equals that argmax. The output is exactly what
//    decoding without speculation gives.
//  - Sampling with certain drafts (n-gram, or any point-mass proposal): the
//    target's own sample at each row, drawn with the uniform number that
//    decoding without speculation would use for that token; a draft is
//    accepted while it equals that sample. For a point-mass proposal this is
//    the standard rejection rule (accept x with probability p(x); otherwise
//    draw from p without x), and seeded outputs stay token-for-token the
//    same as without speculation.
//  - Sampling with drafts from a distribution q (a draft model): standard
//    speculative rejection sampling (engine/sampling/sampler.h), with its own
//    uniform streams; the output is distributed exactly as the target's.
//
// After the first rejection nothing more is emitted (later rows saw a wrong
// token). When every draft is accepted, the last row gives one bonus token.
#ifndef TANDEM_ENGINE_SPECULATIVE_VERIFY_H_
#define TANDEM_ENGINE_SPECULATIVE_VERIFY_H_

#include <cstdint>
#include <span>
#include <vector>

#include "engine/kernels/sampling_arithmetic.h"
#include "engine/speculative/proposer.h"
#include "engine/step/step_plan.h"

namespace tandem::speculative {

struct Verification {
  std::vector<TokenId> tokens;  // accepted drafts, then one more token
  int32_t accepted = 0;         // drafts accepted
};

// `logits` holds draft.tokens.size() + 1 rows of `vocab` floats. The emitted
// tokens are the request's generated tokens draw_index, draw_index + 1, ...
Verification Verify(std::span<const float> logits, int32_t vocab, const Draft& draft,
                    const step::SamplingParams& params, uint64_t draw_index);

// Whether verifying `draft` needs the target's probabilities (drafts sampled
// from a distribution, at temperature > 0), not just its own samples.
bool NeedsTargetDistribution(const Draft& draft, const step::SamplingParams& params);

// Verify() for a draft that does not need the target's distribution, from
// the target's own sample at each row: sampled[i] is row i's token drawn as
// Sample() draws generated token draw_index + i (one per row, k + 1 in all).
// The same tokens as Verify() on those rows.
Verification VerifySampled(std::span<const TokenId> sampled, const Draft& draft);

// Verify() for a draft that needs the target's distribution
// (NeedsTargetDistribution), from what a device gives without copying rows
// of the vocabulary, in two steps so that a batch fetches its rejected rows
// at once:
//  1. AcceptedFromShares(): how many drafts pass the acceptance test (k:
//     all), from shares[i] = drafted token i's NucleusShare of row i under
//     `params` (i < k; Backend::SampleRowsWithShares);
//  2. VerifyFromShares(): the tokens, from the same shares, bonus = row k's
//     own sample (drawn as Sample() draws generated token draw_index + k)
//     and rejected_row = the logits of the row step 1 stopped at, for the
//     residual draw (empty when every draft passed).
// The same tokens as Verify() on every row.
size_t AcceptedFromShares(std::span<const kernels::NucleusShare> shares, const Draft& draft,
                          const step::SamplingParams& params, uint64_t draw_index);
Verification VerifyFromShares(std::span<const kernels::NucleusShare> shares, TokenId bonus,
                              std::span<const float> rejected_row, const Draft& draft,
                              const step::SamplingParams& params, uint64_t draw_index);

// The uniform streams of speculative sampling, apart from the token stream
// that Sample() uses, so that no draw is used twice.
enum class DrawStream : uint64_t {
  kDraftSample = 1,  // a draft model sampling its draft token
  kAccept = 2,       // the acceptance test of a drafted token
  kResidual = 3,     // the replacement after a rejection
};
double SpeculativeDraw(uint64_t seed, DrawStream stream, uint64_t draw_index);

}  // namespace tandem::speculative

#endif  // TANDEM_ENGINE_SPECULATIVE_VERIFY_H_
