#include "engine/speculative/ngram_proposer.h"

#include <algorithm>

#include "common/check.h"

namespace tandem::speculative {

std::vector<TokenId> NgramDraft(std::span<const TokenId> tokens, int32_t min_n, int32_t max_n,
                                int32_t limit) {
  const int64_t size = static_cast<int64_t>(tokens.size());
  if (limit <= 0) return {};
  for (int64_t n = std::min<int64_t>(max_n, size - 1); n >= min_n; --n) {
    const std::span<const TokenId> suffix = tokens.last(static_cast<size_t>(n));
    // Latest start first: recent context predicts best (the line being
    // copied, not the first one that looked alike). A match may overlap the
    // suffix; it needs at least one token after it.
    for (int64_t start = size - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t to = std::min(size, from + limit);
      return std::vector<TokenId>(tokens.begin() + from, tokens.begin() + to);
    }
  }
  return {};
}

NgramProposer::NgramProposer(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {
  TANDEM_CHECK(1 <= min_n && min_n <= max_n, "n-gram sizes must satisfy 1 <= min <= max");
}

absl::Status NgramProposer::Propose(std::span<const DraftRequest> requests,
                                    std::vector<Draft>* drafts) {
  drafts->assign(requests.size(), Draft{});
  for (size_t i = 0; i < requests.size(); ++i) {
    const step::SequenceStep& s = *requests[i].step;
    scratch_.assign(s.preceding_tokens.begin(), s.preceding_tokens.end());
    scratch_.insert(scratch_.end(), s.tokens.begin(), s.tokens.end());
    (*drafts)[i].tokens = NgramDraft(scratch_, min_n_, max_n_, requests[i].limit);
  }
  return absl::OkStatus();
}

}  // namespace tandem::speculative
