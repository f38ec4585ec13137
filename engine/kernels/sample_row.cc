#include "engine/kernels/sample_row.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

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

// A token's rank key and how much it counts in a selection (1 for top-k,
// its weight for top-p).
struct Item {
  uint64_t key;
  uint64_t amount;
};

// The largest key K such that the items with keys >= K amount to at least
// `needed` (0 < needed <= the total). Keys are distinct, so K is one item's
// key. A most-significant-digit radix select, 8 bits at a time, keeping only
// the chosen bucket's items: about two passes over the items in all.
uint64_t SelectKey(std::vector<Item>& items, std::vector<Item>& spare, uint64_t needed) {
  uint64_t prefix = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    uint64_t sums[256] = {};
    for (const Item& item : items) sums[(item.key >> shift) & 0xFFu] += item.amount;
    uint64_t bucket = 255, above = 0;
    for (; bucket > 0; --bucket) {
      if (above + sums[bucket] >= needed) break;
      above += sums[bucket];
    }
    needed -= above;
    prefix |= bucket << shift;
    spare.clear();
    for (const Item& item : items) {
      if (((item.key >> shift) & 0xFFu) == bucket) spare.push_back(item);
    }
    items.swap(spare);
    if (items.size() == 1) return items[0].key;
  }
  return prefix;
}

// The largest key K such that at least k of `keys` are >= K (0 < k <=
// keys.size()): the k-th largest, through a min-heap of the k largest seen
// (most keys fail the first comparison).
uint64_t KthLargest(std::span<const uint64_t> keys, size_t k, std::vector<uint64_t>& heap) {
  heap.assign(keys.begin(), keys.begin() + static_cast<long>(k));
  std::make_heap(heap.begin(), heap.end(), std::greater<>());
  for (size_t i = k; i < keys.size(); ++i) {
    if (keys[i] <= heap.front()) continue;
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    heap.back() = keys[i];
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  }
  return heap.front();
}

// The nucleus being cut, and per-thread buffers, so that sampling a row
// allocates nothing once they have grown.
struct Work {
  std::vector<int32_t> ids;       // ascending
  std::vector<uint64_t> weights;  // of each id
  uint64_t mass = 0;
  std::vector<uint64_t> keys, heap;
  std::vector<Item> items, spare;
};

// Fills `work` with the nucleus of a sampled draw (sample_row.h).
void Cut(std::span<const float> row, const RowDraw& draw, Work& work) {
  const size_t n = row.size();
  const float max = row[static_cast<size_t>(ArgMax(row))];
  const double inverse_temperature = sa::InverseTemperature(draw.temperature);
  const bool cut_k = draw.top_k > 0 && static_cast<size_t>(draw.top_k) < n;
  const bool cut_p = draw.top_p < 1.0f;
  // Rank keys, weights: branch-free loops the compiler vectorises (this
  // file compiles without trapping math, which changes no result).
  if (cut_k || cut_p) {
    work.keys.resize(n);
    for (size_t i = 0; i < n; ++i) work.keys[i] = sa::RankKey(row[i], static_cast<int32_t>(i));
  }
  work.ids.clear();
  work.weights.clear();
  if (cut_k) {
    const auto k = static_cast<size_t>(draw.top_k);
    uint64_t kth;
    if (k <= 4096) {
      kth = KthLargest(work.keys, k, work.heap);
    } else {
      work.items.resize(n);
      for (size_t i = 0; i < n; ++i) work.items[i] = {work.keys[i], 1};
      kth = SelectKey(work.items, work.spare, k);
    }
    for (size_t i = 0; i < n; ++i) {
      if (work.keys[i] < kth) continue;
      work.ids.push_back(static_cast<int32_t>(i));
      work.weights.push_back(sa::Weight(row[i], max, inverse_temperature));
    }
  } else {
    work.ids.resize(n);
    std::iota(work.ids.begin(), work.ids.end(), 0);
    work.weights.resize(n);
    for (size_t i = 0; i < n; ++i) work.weights[i] = sa::Weight(row[i], max, inverse_temperature);
  }
  work.mass = 0;
  for (uint64_t w : work.weights) work.mass += w;
  if (!cut_p) return;

  work.items.clear();
  for (size_t j = 0; j < work.ids.size(); ++j) {
    if (work.weights[j] == 0) continue;  // never reaches the nucleus mass
    work.items.push_back({work.keys[static_cast<size_t>(work.ids[j])], work.weights[j]});
  }
  const uint64_t last = SelectKey(work.items, work.spare, sa::NucleusMass(draw.top_p, work.mass));
  size_t kept = 0;
  work.mass = 0;
  for (size_t j = 0; j < work.ids.size(); ++j) {
    if (work.keys[static_cast<size_t>(work.ids[j])] < last) continue;
    work.ids[kept] = work.ids[j];
    work.weights[kept] = work.weights[j];
    work.mass += work.weights[j];
    ++kept;
  }
  work.ids.resize(kept);
  work.weights.resize(kept);
}

thread_local Work work;

}  // namespace

Nucleus NucleusOf(std::span<const float> row, const RowDraw& draw) {
  Cut(row, draw, work);
  return {work.ids, work.weights, work.mass};
}

namespace {

// The draw from the nucleus in `work` (mass > 0).
int32_t DrawFromCut(const Work& cut, double u) {
  const uint64_t target = sa::DrawTarget(u, cut.mass);
  uint64_t cumulative = 0;
  for (size_t j = 0; j < cut.ids.size(); ++j) {
    cumulative += cut.weights[j];
    if (cumulative > target) return cut.ids[j];
  }
  return cut.ids.back();  // unreachable: target < mass
}

NucleusShare ShareInCut(const Work& cut, int32_t token) {
  const auto it = std::lower_bound(cut.ids.begin(), cut.ids.end(), token);
  const bool inside = it != cut.ids.end() && *it == token;
  return {inside ? cut.weights[static_cast<size_t>(it - cut.ids.begin())] : 0, cut.mass};
}

}  // namespace

int32_t SampleRow(std::span<const float> row, const RowDraw& draw) {
  if (draw.temperature <= 0.0f || row.size() == 1) return ArgMax(row);
  Cut(row, draw, work);
  if (work.mass == 0) return ArgMax(row);  // only NaN logits get here (unsupported)
  return DrawFromCut(work, draw.u);
}

int32_t SampleRowWithShare(std::span<const float> row, const RowDraw& draw, int32_t token,
                           NucleusShare* share) {
  if (draw.temperature > 0.0f && row.size() > 1) {
    Cut(row, draw, work);
    if (work.mass > 0) {  // 0: only NaN logits (unsupported), drawn as greedy
      *share = ShareInCut(work, token);
      return DrawFromCut(work, draw.u);
    }
  }
  const int32_t argmax = ArgMax(row);
  *share = sa::PointMassShare(argmax, token);
  return argmax;
}

RowLogprobs LogprobsOf(std::span<const float> row, int32_t token, int top) {
  const double max = row[static_cast<size_t>(ArgMax(row))];
  double sum = 0.0;
  for (float l : row) sum += std::exp(static_cast<double>(l) - max);
  const double log_z = max + std::log(sum);
  RowLogprobs out;
  out.token = static_cast<float>(row[static_cast<size_t>(token)] - log_z);
  const size_t k = std::min(static_cast<size_t>(std::max(top, 0)), row.size());
  if (k == 0) return out;
  std::vector<int32_t> ids(row.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + static_cast<long>(k), ids.end(),
                    [row](int32_t a, int32_t b) {
                      return sa::RankKey(row[static_cast<size_t>(a)], a) >
                             sa::RankKey(row[static_cast<size_t>(b)], b);
                    });
  for (size_t i = 0; i < k; ++i) {
    out.top.emplace_back(ids[i], static_cast<float>(row[static_cast<size_t>(ids[i])] - log_z));
  }
  return out;
}

}  // namespace tandem::kernels
