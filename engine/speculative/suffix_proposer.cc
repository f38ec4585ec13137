#include "engine/speculative/suffix_proposer.h"

#include <algorithm>

#include "common/check.h"

namespace tandem::speculative {

void SuffixMatcher::Append(std::span<const TokenId> tokens) {
  for (TokenId token : tokens) {
    const auto position = static_cast<int64_t>(tokens_.size());
    if (source_ >= 0) {
      if (tokens_[static_cast<size_t>(source_)] == token) {
        ++source_;
      } else {
        left_at_ = source_;
        source_ = -1;
      }
    }
    tokens_.push_back(token);
    positions_[token].push_back(static_cast<int32_t>(position));
  }
}

int32_t SuffixMatcher::MatchBefore(int64_t a, int64_t b) const {
  int32_t length = 0;
  while (length < kMaxMatch && a - 1 - length >= 0 &&
         tokens_[static_cast<size_t>(a - 1 - length)] ==
             tokens_[static_cast<size_t>(b - 1 - length)]) {
    ++length;
  }
  return length;
}

std::vector<TokenId> SuffixMatcher::Draft(int32_t limit, int32_t min_match) {
  const auto size = static_cast<int64_t>(tokens_.size());
  if (limit <= 0 || size < 2) return {};
  if (source_ < 0) {
    // Candidates: every earlier occurrence p of the last token; the copy
    // would start at p + 1.
    const std::vector<int32_t>& occurrences = positions_[tokens_.back()];
    const int64_t usable = static_cast<int64_t>(occurrences.size()) - 1;  // less the last token
    const int64_t oldest = std::max<int64_t>(0, usable - kMaxCandidates);
    int64_t chosen = -1;
    // Resume a copy that diverged: the nearest start just past where it left
    // (the output skipped or replaced a few tokens and goes on as before).
    if (left_at_ >= 0) {
      for (int64_t i = oldest; i < usable; ++i) {
        const int64_t start = occurrences[static_cast<size_t>(i)] + 1;
        if (start > left_at_ + kResyncWindow) break;  // increasing: none further
        if (start > left_at_ && MatchBefore(start, size) >= min_match) {
          chosen = start;
          break;
        }
      }
    }
    // Otherwise the longest match; among equals the latest.
    if (chosen < 0) {
      int32_t best = min_match - 1;
      for (int64_t i = usable - 1; i >= oldest; --i) {
        const int64_t start = occurrences[static_cast<size_t>(i)] + 1;
        const int32_t match = MatchBefore(start, size);
        if (match > best) {
          best = match;
          chosen = start;
          if (match == kMaxMatch) break;
        }
      }
    }
    if (chosen < 0) return {};
    source_ = chosen;
    left_at_ = -1;
  }
  const int64_t end = std::min(size, source_ + limit);
  return std::vector<TokenId>(tokens_.begin() + source_, tokens_.begin() + end);
}

SuffixProposer::SuffixProposer(int32_t min_match) : min_match_(min_match) {
  TANDEM_CHECK(min_match >= 1, "the suffix proposer's shortest match must be at least 1");
}

absl::Status SuffixProposer::Propose(std::span<const DraftRequest> requests,
                                     std::vector<Draft>* drafts) {
  ++calls_;
  drafts->assign(requests.size(), Draft{});
  for (size_t i = 0; i < requests.size(); ++i) {
    const step::SequenceStep& s = *requests[i].step;
    const std::span<const TokenId> before = s.preceding_tokens, last = s.tokens;
    const size_t total = before.size() + last.size();
    auto at = [&](size_t k) { return k < before.size() ? before[k] : last[k - before.size()]; };
    Tracked& tracked = matchers_[s.sequence_id];
    tracked.last_call = calls_;
    // The matcher holds a prefix of the sequence; anything else (a sequence
    // recomputed differently) starts over.
    const size_t have = tracked.matcher.tokens().size();
    if (have > total || (have > 0 && tracked.matcher.tokens()[have - 1] != at(have - 1))) {
      tracked.matcher = SuffixMatcher();
    }
    for (size_t k = tracked.matcher.tokens().size(); k < total; ++k) {
      const TokenId token = at(k);
      tracked.matcher.Append(std::span<const TokenId>(&token, 1));
    }
    (*drafts)[i].tokens = tracked.matcher.Draft(requests[i].limit, min_match_);
  }
  // Sequences that stopped asking (finished, or drafting nothing for long)
  // are dropped; one that asks again rebuilds its matcher.
  if (calls_ % 64 == 0) {
    for (auto it = matchers_.begin(); it != matchers_.end();) {
      if (it->second.last_call + kIdleCalls < calls_) {
        matchers_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::speculative
