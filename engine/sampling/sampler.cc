#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tandem::sampling {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

step::TokenLogprobs Logprobs(std::span<const float> logits, step::TokenId token, int top) {
  kernels::RowLogprobs row = kernels::LogprobsOf(logits, token, top);
  step::TokenLogprobs out;
  out.token = token;
  out.logprob = row.token;
  out.top = std::move(row.top);
  return out;
}

double UniformDraw(uint64_t seed, uint64_t draw_index) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ (draw_index * 0xD1B54A32D192ED03ull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

step::TokenId Sample(std::span<const float> logits, const step::SamplingParams& params,
                     uint64_t draw_index) {
  return SampleWithDraw(logits, params, UniformDraw(params.seed, draw_index));
}

kernels::RowDraw RowDrawOf(const step::SamplingParams& params, double u) {
  kernels::RowDraw draw;
  draw.temperature = params.temperature;
  draw.top_k = params.top_k;
  draw.top_p = params.top_p;
  draw.u = u;
  return draw;
}

step::TokenId SampleWithDraw(std::span<const float> logits, const step::SamplingParams& params,
                             double u) {
  return kernels::SampleRow(logits, RowDrawOf(params, u));
}

std::vector<float> Probabilities(std::span<const float> logits,
                                 const step::SamplingParams& params) {
  std::vector<float> p(logits.size(), 0.0f);
  if (params.temperature <= 0.0f || logits.size() == 1) {
    p[static_cast<size_t>(kernels::ArgMax(logits))] = 1.0f;
    return p;
  }
  const kernels::Nucleus nucleus = kernels::NucleusOf(logits, RowDrawOf(params, 0.0));
  const auto mass = static_cast<double>(nucleus.mass);
  for (size_t i = 0; i < nucleus.ids.size(); ++i) {
    p[static_cast<size_t>(nucleus.ids[i])] =
        static_cast<float>(static_cast<double>(nucleus.weights[i]) / mass);
  }
  return p;
}

step::TokenId DrawFrom(std::span<const float> probabilities, double u) {
  double total = 0.0;
  for (float x : probabilities) total += x;
  const double target = u * total;
  double cumulative = 0.0;
  size_t last_positive = 0;
  for (size_t i = 0; i < probabilities.size(); ++i) {
    if (probabilities[i] <= 0.0f) continue;
    cumulative += probabilities[i];
    last_positive = i;
    if (target < cumulative) return static_cast<step::TokenId>(i);
  }
  return static_cast<step::TokenId>(last_positive);
}

bool AcceptDraft(std::span<const float> p, std::span<const float> q, step::TokenId x, double u) {
  return AcceptDraftAt(p[static_cast<size_t>(x)], q[static_cast<size_t>(x)], u);
}

bool AcceptDraftAt(float p_x, float q_x, double u) {
  // Accept with probability min(1, p/q); u < p/q without dividing by a tiny q.
  return u * static_cast<double>(q_x) < static_cast<double>(p_x);
}

float ShareProbability(const kernels::NucleusShare& share) {
  // Probabilities(): weight / mass in double, rounded to float once.
  return static_cast<float>(static_cast<double>(share.weight) / static_cast<double>(share.mass));
}

step::TokenId DrawResidual(std::span<const float> p, std::span<const float> q, double u) {
  std::vector<float> residual(p.size());
  double total = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    residual[i] = std::max(0.0f, p[i] - q[i]);
    total += residual[i];
  }
  // Rejection has probability sum(max(0, q - p)) = sum(max(0, p - q)); when
  // that is zero (p == q up to rounding), a rejection cannot happen in exact
  // arithmetic, and p itself is the right fallback.
  if (total <= 0.0) return DrawFrom(p, u);
  return DrawFrom(residual, u);
}

}  // namespace tandem::sampling
