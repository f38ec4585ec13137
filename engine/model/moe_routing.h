// Mixture-of-experts routing (Qwen3-MoE, OLMoE): which experts each token's
// feed-forward goes through, and with what weights, from the router's logits.
//
// Per token: the softmax of its router logits, the `used` most probable
// experts (the lower index first among equal probabilities), their
// probabilities optionally renormalised to sum to 1 and scaled. Each token
// is routed from its own row alone, so a token's experts and weights never
// depend on the batch it is in.
#ifndef TANDEM_ENGINE_MODEL_MOE_ROUTING_H_
#define TANDEM_ENGINE_MODEL_MOE_ROUTING_H_

#include <cstdint>
#include <vector>

namespace tandem::model {

struct MoeRoutingRule {
  int experts = 0;  // router logits per token
  int used = 0;     // experts each token goes through
  bool normalize = false;
  float scale = 1.0f;
};

// The tokens each expert serves: rows[e] (ascending token rows) with
// weights[e][i] the weight of expert e's output for token rows[e][i].
struct ExpertAssignment {
  std::vector<std::vector<int32_t>> rows;
  std::vector<std::vector<float>> weights;
};

// Routes `tokens` rows of rule.experts logits (row-major). REQUIRES
// 1 <= rule.used <= rule.experts. Reuses `out`'s vectors.
void RouteTokens(const float* logits, int64_t tokens, const MoeRoutingRule& rule,
                 ExpertAssignment& out);

}  // namespace tandem::model

#endif  // TANDEM_ENGINE_MODEL_MOE_ROUTING_H_
