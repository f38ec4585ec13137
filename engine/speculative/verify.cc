#include "engine/speculative/verify.h"

#include "common/check.h"
#include "engine/sampling/sampler.h"

namespace tandem::speculative {

double SpeculativeDraw(uint64_t seed, DrawStream stream, uint64_t draw_index) {
  // A different seed per stream; the golden-ratio multiplier spreads them.
  return sampling::UniformDraw(seed ^ (static_cast<uint64_t>(stream) * 0x9E3779B97F4A7C15ull),
                               draw_index);
}

bool NeedsTargetDistribution(const Draft& draft, const step::SamplingParams& params) {
  return !draft.probabilities.empty() && params.temperature > 0.0f;
}

Verification VerifySampled(std::span<const TokenId> sampled, const Draft& draft) {
  TANDEM_CHECK(sampled.size() == draft.tokens.size() + 1,
               "verification needs one sampled token per draft + 1");
  Verification out;
  for (size_t i = 0; i < sampled.size(); ++i) {
    out.tokens.push_back(sampled[i]);
    if (i == draft.tokens.size() || sampled[i] != draft.tokens[i]) break;
    ++out.accepted;
  }
  return out;
}

size_t AcceptedFromShares(std::span<const kernels::NucleusShare> shares, const Draft& draft,
                          const step::SamplingParams& params, uint64_t draw_index) {
  const size_t k = draft.tokens.size();
  TANDEM_CHECK(NeedsTargetDistribution(draft, params) && draft.probabilities.size() == k &&
                   shares.size() == k,
               "verification from shares needs a sampled draft and one share per token");
  for (size_t i = 0; i < k; ++i) {
    const TokenId drafted = draft.tokens[i];
    const float q_x = draft.probabilities[i][static_cast<size_t>(drafted)];
    if (!sampling::AcceptDraftAt(
            sampling::ShareProbability(shares[i]), q_x,
            SpeculativeDraw(params.seed, DrawStream::kAccept, draw_index + i))) {
      return i;
    }
  }
  return k;
}

Verification VerifyFromShares(std::span<const kernels::NucleusShare> shares, TokenId bonus,
                              std::span<const float> rejected_row, const Draft& draft,
                              const step::SamplingParams& params, uint64_t draw_index) {
  const size_t accepted = AcceptedFromShares(shares, draft, params, draw_index);
  Verification out;
  out.tokens.assign(draft.tokens.begin(), draft.tokens.begin() + static_cast<long>(accepted));
  out.accepted = static_cast<int32_t>(accepted);
  if (accepted == draft.tokens.size()) {
    out.tokens.push_back(bonus);  // every draft accepted
    return out;
  }
  TANDEM_CHECK(!rejected_row.empty(), "a rejected draft needs its row's logits");
  const std::vector<float> p = sampling::Probabilities(rejected_row, params);
  out.tokens.push_back(sampling::DrawResidual(
      p, draft.probabilities[accepted],
      SpeculativeDraw(params.seed, DrawStream::kResidual, draw_index + accepted)));
  return out;
}

Verification Verify(std::span<const float> logits, int32_t vocab, const Draft& draft,
                    const step::SamplingParams& params, uint64_t draw_index) {
  const size_t k = draft.tokens.size();
  const size_t v = static_cast<size_t>(vocab);
  TANDEM_CHECK(logits.size() == (k + 1) * v, "verification needs one logits row per draft + 1");
  const bool sampled_drafts = NeedsTargetDistribution(draft, params);
  TANDEM_CHECK(draft.probabilities.empty() || draft.probabilities.size() == k,
               "a sampled draft needs one distribution per token");
  Verification out;
  for (size_t i = 0; i <= k; ++i) {
    const std::span<const float> row = logits.subspan(i * v, v);
    const uint64_t index = draw_index + i;
    if (i == k) {  // every draft accepted: the bonus token
      out.tokens.push_back(sampling::Sample(row, params, index));
      break;
    }
    const TokenId drafted = draft.tokens[i];
    if (sampled_drafts) {
      const std::vector<float> p = sampling::Probabilities(row, params);
      const std::span<const float> q = draft.probabilities[i];
      if (sampling::AcceptDraft(p, q, drafted,
                                SpeculativeDraw(params.seed, DrawStream::kAccept, index))) {
        out.tokens.push_back(drafted);
        ++out.accepted;
        continue;
      }
      out.tokens.push_back(
          sampling::DrawResidual(p, q, SpeculativeDraw(params.seed, DrawStream::kResidual, index)));
      break;
    }
    const TokenId target = sampling::Sample(row, params, index);
    out.tokens.push_back(target);
    if (target != drafted) break;
    ++out.accepted;
  }
  return out;
}

}  // namespace tandem::speculative
