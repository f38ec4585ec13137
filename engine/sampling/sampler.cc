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

struct Candidate {
  float logit;
  step::TokenId id;
};

// Descending logit, then ascending id: a total order, so sorting is stable
// across platforms and batch compositions.
bool MoreLikely(const Candidate& a, const Candidate& b) {
  return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
}

step::TokenId Greedy(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<step::TokenId>(best);
}

}  // namespace

step::TokenLogprobs Logprobs(std::span<const float> logits, step::TokenId token, int top) {
  const double max = logits[static_cast<size_t>(Greedy(logits))];
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  const double log_z = max + std::log(sum);
  step::TokenLogprobs out;
  out.token = token;
  out.logprob = static_cast<float>(logits[static_cast<size_t>(token)] - log_z);
  const size_t k = std::min(static_cast<size_t>(std::max(top, 0)), logits.size());
  if (k == 0) return out;
  std::vector<Candidate> c(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c[i] = {logits[i], static_cast<step::TokenId>(i)};
  std::partial_sort(c.begin(), c.begin() + static_cast<long>(k), c.end(), MoreLikely);
  for (size_t i = 0; i < k; ++i) {
    out.top.emplace_back(c[i].id, static_cast<float>(c[i].logit - log_z));
  }
  return out;
}

double UniformDraw(uint64_t seed, uint64_t draw_index) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ (draw_index * 0xD1B54A32D192ED03ull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

namespace {

// The tokens Sample() may draw when top-k or top-p cut the vocabulary, most
// likely first, with their unnormalised weights and the weights' sum.
struct Nucleus {
  std::vector<Candidate> kept;
  std::vector<double> weights;
  double mass = 0.0;
};

// The nucleus of `c`, the candidates most likely first (all of them, or the
// top-k, sorted). Without top-k, sorts only as much as the nucleus needs.
Nucleus NucleusOf(std::vector<Candidate> c, size_t n, const step::SamplingParams& params,
                  double max_logit) {
  const size_t keep = c.size();
  const double inverse_temperature = 1.0 / params.temperature;
  auto weight = [&](float logit) {
    return std::exp((static_cast<double>(logit) - max_logit) * inverse_temperature);
  };
  // The nucleus: the shortest most-likely prefix holding top_p of the mass.
  double total = 0.0;
  for (const Candidate& cand : c) total += weight(cand.logit);
  const double threshold = std::min(1.0, static_cast<double>(params.top_p)) * total;
  size_t sorted = keep < n ? keep : std::min<size_t>(n, 64);
  size_t cut = 0;
  double kept_mass = 0.0;
  for (;;) {
    if (keep == n) {
      std::partial_sort(c.begin(), c.begin() + static_cast<long>(sorted), c.end(), MoreLikely);
    }
    kept_mass = 0.0;
    for (cut = 0; cut < sorted;) {
      kept_mass += weight(c[cut].logit);
      ++cut;
      if (kept_mass >= threshold) break;
    }
    if (kept_mass >= threshold || sorted == c.size()) break;
    sorted = std::min(c.size(), sorted * 8);
  }
  Nucleus out;
  c.resize(cut);
  out.kept = std::move(c);
  out.weights.reserve(cut);
  for (const Candidate& cand : out.kept) out.weights.push_back(weight(cand.logit));
  out.mass = kept_mass;
  return out;
}

Nucleus TruncatedNucleus(std::span<const float> logits, const step::SamplingParams& params,
                         double max_logit) {
  const size_t n = logits.size();
  const size_t keep = params.top_k > 0 ? std::min<size_t>(static_cast<size_t>(params.top_k), n) : n;
  std::vector<Candidate> c(n);
  for (size_t i = 0; i < n; ++i) c[i] = {logits[i], static_cast<step::TokenId>(i)};
  if (keep < n) {
    std::nth_element(c.begin(), c.begin() + static_cast<long>(keep), c.end(), MoreLikely);
    c.resize(keep);
    std::sort(c.begin(), c.end(), MoreLikely);
  }
  return NucleusOf(std::move(c), n, params, max_logit);
}

step::TokenId Draw(const Nucleus& nucleus, double u) {
  const double target = u * nucleus.mass;
  double cumulative = 0.0;
  for (size_t i = 0; i < nucleus.kept.size(); ++i) {
    cumulative += nucleus.weights[i];
    if (target < cumulative) return nucleus.kept[i].id;
  }
  return nucleus.kept.back().id;
}

}  // namespace

step::TokenId Sample(std::span<const float> logits, const step::SamplingParams& params,
                     uint64_t draw_index) {
  return SampleWithDraw(logits, params, UniformDraw(params.seed, draw_index));
}

step::TokenId SampleWithDraw(std::span<const float> logits, const step::SamplingParams& params,
                             double u) {
  if (params.temperature <= 0.0f || logits.size() == 1) return Greedy(logits);
  const size_t n = logits.size();
  const double max_logit = logits[static_cast<size_t>(Greedy(logits))];
  if ((params.top_k <= 0 || static_cast<size_t>(params.top_k) >= n) && params.top_p >= 1.0f) {
    // Plain temperature sampling: walk the vocabulary in id order.
    const double inverse_temperature = 1.0 / params.temperature;
    auto weight = [&](float logit) {
      return std::exp((static_cast<double>(logit) - max_logit) * inverse_temperature);
    };
    double total = 0.0;
    for (float l : logits) total += weight(l);
    const double target = u * total;
    double cumulative = 0.0;
    for (size_t i = 0; i < n; ++i) {
      cumulative += weight(logits[i]);
      if (target < cumulative) return static_cast<step::TokenId>(i);
    }
    return Greedy(logits);
  }
  return Draw(TruncatedNucleus(logits, params, max_logit), u);
}

bool CanSampleFromTopK(const step::SamplingParams& params, size_t vocab, size_t k) {
  if (params.temperature <= 0.0f || vocab == 1) return k >= 1;
  return params.top_k > 0 && static_cast<size_t>(params.top_k) < vocab &&
         static_cast<size_t>(params.top_k) <= k;
}

step::TokenId SampleFromTopK(std::span<const float> values, std::span<const int32_t> ids,
                             size_t vocab, const step::SamplingParams& params, double u) {
  if (params.temperature <= 0.0f || vocab == 1) return ids[0];
  const size_t keep = static_cast<size_t>(params.top_k);
  std::vector<Candidate> c(keep);
  for (size_t i = 0; i < keep; ++i) c[i] = {values[i], ids[i]};
  return Draw(NucleusOf(std::move(c), vocab, params, values[0]), u);
}

std::vector<float> Probabilities(std::span<const float> logits,
                                 const step::SamplingParams& params) {
  std::vector<float> p(logits.size(), 0.0f);
  if (params.temperature <= 0.0f || logits.size() == 1) {
    p[static_cast<size_t>(Greedy(logits))] = 1.0f;
    return p;
  }
  const double max_logit = logits[static_cast<size_t>(Greedy(logits))];
  const Nucleus nucleus = TruncatedNucleus(logits, params, max_logit);
  for (size_t i = 0; i < nucleus.kept.size(); ++i) {
    p[static_cast<size_t>(nucleus.kept[i].id)] =
        static_cast<float>(nucleus.weights[i] / nucleus.mass);
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
  const double px = p[static_cast<size_t>(x)];
  const double qx = q[static_cast<size_t>(x)];
  // Accept with probability min(1, p/q); u < p/q without dividing by a tiny q.
  return u * qx < px;
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
