#include "engine/kernels/sample_row.h"

#include <algorithm>

namespace tandem::kernels {
namespace sa = sampling_arithmetic;

int32_t ArgMax(std::span<const float> row) {
  size_t best = 0;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] > row[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

namespace {

struct Entry {
  int32_t id;
  uint64_t weight;
};

}  // namespace

Nucleus NucleusOf(std::span<const float> row, const RowDraw& draw) {
  const size_t n = row.size();
  const float max = row[static_cast<size_t>(ArgMax(row))];
  const double inverse_temperature = sa::InverseTemperature(draw.temperature);
  auto ranked_before = [row](const Entry& a, const Entry& b) {
    return sa::RankKey(row[static_cast<size_t>(a.id)], a.id) >
           sa::RankKey(row[static_cast<size_t>(b.id)], b.id);
  };

  // The top-k cut: the k first-ranked ids (all ids without a cut).
  std::vector<Entry> kept(n);
  for (size_t i = 0; i < n; ++i) kept[i].id = static_cast<int32_t>(i);
  if (draw.top_k > 0 && static_cast<size_t>(draw.top_k) < n) {
    const auto k = static_cast<long>(draw.top_k);
    std::nth_element(kept.begin(), kept.begin() + (k - 1), kept.end(), ranked_before);
    kept.resize(static_cast<size_t>(k));
  }
  uint64_t total = 0;
  for (Entry& e : kept) {
    e.weight = sa::Weight(row[static_cast<size_t>(e.id)], max, inverse_temperature);
    total += e.weight;
  }

  // The top-p cut: the shortest ranked prefix reaching the nucleus mass.
  // Ranks only as much as the prefix needs (a few dozen ids, usually).
  if (draw.top_p < 1.0f) {
    const uint64_t needed = sa::NucleusMass(draw.top_p, total);
    size_t ranked = std::min<size_t>(kept.size(), 64);
    for (;;) {
      std::partial_sort(kept.begin(), kept.begin() + static_cast<long>(ranked), kept.end(),
                        ranked_before);
      uint64_t mass = 0;
      size_t cut = 0;
      while (cut < ranked && mass < needed) mass += kept[cut++].weight;
      if (mass >= needed || ranked == kept.size()) {
        kept.resize(cut);
        break;
      }
      ranked = std::min(kept.size(), ranked * 8);
    }
  }
  if (kept.size() < n) {
    std::sort(kept.begin(), kept.end(), [](const Entry& a, const Entry& b) { return a.id < b.id; });
  }

  Nucleus out;
  out.ids.reserve(kept.size());
  out.weights.reserve(kept.size());
  for (const Entry& e : kept) {
    out.ids.push_back(e.id);
    out.weights.push_back(e.weight);
    out.mass += e.weight;
  }
  return out;
}

int32_t SampleRow(std::span<const float> row, const RowDraw& draw) {
  if (draw.temperature <= 0.0f || row.size() == 1) return ArgMax(row);
  const Nucleus nucleus = NucleusOf(row, draw);
  const uint64_t target = sa::DrawTarget(draw.u, nucleus.mass);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < nucleus.ids.size(); ++i) {
    cumulative += nucleus.weights[i];
    if (cumulative > target) return nucleus.ids[i];
  }
  return nucleus.ids.back();  // unreachable: target < mass
}

}  // namespace tandem::kernels
