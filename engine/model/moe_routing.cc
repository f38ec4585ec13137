#include "engine/model/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tandem::model {

void RouteTokens(const float* logits, int64_t tokens, const MoeRoutingRule& rule,
                 ExpertAssignment& out) {
  const auto experts = static_cast<size_t>(rule.experts);
  out.rows.resize(experts);
  out.weights.resize(experts);
  for (size_t e = 0; e < experts; ++e) {
    out.rows[e].clear();
    out.weights[e].clear();
  }
  std::vector<double> probability(experts);
  std::vector<int32_t> order(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = logits + t * rule.experts;
    // Softmax in double: the probabilities order the experts, so ties are
    // decided by the logits, not by rounding.
    const double max = *std::max_element(row, row + rule.experts);
    double sum = 0.0;
    for (size_t e = 0; e < experts; ++e) sum += probability[e] = std::exp(row[e] - max);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(
        order.begin(), order.begin() + rule.used, order.end(), [&](int32_t a, int32_t b) {
          const auto ua = static_cast<size_t>(a), ub = static_cast<size_t>(b);
          return probability[ua] > probability[ub] || (probability[ua] == probability[ub] && a < b);
        });
    const auto used = static_cast<size_t>(rule.used);
    double chosen = 0.0;
    for (size_t i = 0; i < used; ++i) chosen += probability[static_cast<size_t>(order[i])];
    const double denominator = rule.normalize ? chosen : sum;
    for (size_t i = 0; i < used; ++i) {
      const auto e = static_cast<size_t>(order[i]);
      out.rows[e].push_back(static_cast<int32_t>(t));
      out.weights[e].push_back(static_cast<float>(probability[e] / denominator * rule.scale));
    }
  }
}

}  // namespace tandem::model
