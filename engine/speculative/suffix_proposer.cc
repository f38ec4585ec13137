#include "engine/speculative/suffix_proposer.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"

namespace tandem::speculative {

void SuffixMatcher::Append(std::span<const TokenId> tokens) {
  for (TokenId token : tokens) {
    const auto position = static_cast<int64_t>(tokens_.size());
    if (copying_ != Where::kNone) {
      const TokenId expected = copying_ == Where::kOwn ? tokens_[static_cast<size_t>(source_)]
                                                       : cache_copy_[static_cast<size_t>(source_)];
      if (expected == token) {
        ++source_;
        ++agreed_;
        // A cache copy used up: the next draft looks the cache up again
        // (where the copy's text goes on, it matches the longest).
        if (copying_ == Where::kCache && source_ == static_cast<int64_t>(cache_copy_.size())) {
          copying_ = Where::kNone;
          left_at_ = -1;
        }
      } else {
        left_in_ = copying_;
        left_at_ = source_;
        copying_ = Where::kNone;
      }
    }
    tokens_.push_back(token);
    positions_[token].push_back(static_cast<int32_t>(position));
  }
}

bool SuffixMatcher::StartCopy(Where where, int64_t source, int32_t agreed) {
  copying_ = where;
  source_ = source;
  agreed_ = agreed;
  return true;
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

int32_t SuffixMatcher::CopyMatchBefore(int64_t start) const {
  const auto size = static_cast<int64_t>(tokens_.size());
  int32_t length = 0;
  while (length < kMaxMatch && start - 1 - length >= 0 && size - 1 - length >= 0 &&
         cache_copy_[static_cast<size_t>(start - 1 - length)] ==
             tokens_[static_cast<size_t>(size - 1 - length)]) {
    ++length;
  }
  return length;
}

bool SuffixMatcher::Resume(int32_t min_match) {
  const auto size = static_cast<int64_t>(tokens_.size());
  if (left_in_ == Where::kCache) {
    // The nearest start just past where the copy left, inside what was
    // taken from the cache, with something left to copy.
    const auto end =
        std::min<int64_t>(left_at_ + kResyncWindow, static_cast<int64_t>(cache_copy_.size()) - 1);
    for (int64_t start = left_at_ + 1; start <= end; ++start) {
      const int32_t match = CopyMatchBefore(start);
      if (match >= min_match) {
        return StartCopy(Where::kCache, start, match);
      }
    }
    return false;
  }
  // In the stream: the nearest occurrence of the last token just past where
  // the copy left (the output skipped or replaced a few tokens and goes on
  // as before).
  const std::vector<int32_t>& occurrences = positions_[tokens_.back()];
  const int64_t usable = static_cast<int64_t>(occurrences.size()) - 1;  // less the last token
  for (int64_t i = std::max<int64_t>(0, usable - kMaxCandidates); i < usable; ++i) {
    const int64_t start = occurrences[static_cast<size_t>(i)] + 1;
    if (start > left_at_ + kResyncWindow) break;  // increasing: none further
    if (start <= left_at_) continue;
    const int32_t match = MatchBefore(start, size);
    if (match >= min_match) {
      return StartCopy(Where::kOwn, start, match);
    }
  }
  return false;
}

bool SuffixMatcher::Search(const SuffixDraftOptions& options) {
  const auto size = static_cast<int64_t>(tokens_.size());
  // The stream: every earlier occurrence p of the last token (the copy
  // would start at p + 1); the longest match, among equals the most shared
  // continuation, then the latest (TiedMatches).
  TiedMatches ties;
  const std::vector<int32_t>& occurrences = positions_[tokens_.back()];
  const int64_t usable = static_cast<int64_t>(occurrences.size()) - 1;  // less the last token
  for (int64_t i = usable - 1; i >= std::max<int64_t>(0, usable - kMaxCandidates); --i) {
    const int64_t start = occurrences[static_cast<size_t>(i)] + 1;
    const int32_t match = MatchBefore(start, size);
    if (match >= options.min_match) ties.Offer(start, match, tokens_[static_cast<size_t>(start)]);
  }
  const int64_t chosen = ties.Chosen().position;
  const int32_t best = chosen < 0 ? options.min_match - 1 : ties.length();
  // The cache, when it matches longer than the request's own tokens (which
  // are the more likely to be copied on a tie).
  if (options.cache != nullptr && best < kMaxMatch) {
    const size_t tail = std::min<size_t>(tokens_.size(), kMaxMatch);
    SuffixCache::Copy copy = options.cache->LongestCopy(
        options.salt, std::span<const TokenId>(tokens_).last(tail), best + 1, kCacheCopy);
    if (!copy.tokens.empty()) {
      cache_copy_ = std::move(copy.tokens);
      return StartCopy(Where::kCache, 0, copy.length);
    }
  }
  if (chosen < 0) return false;
  return StartCopy(Where::kOwn, chosen, best);
}

SuffixDraft SuffixMatcher::Draft(int32_t limit, const SuffixDraftOptions& options) {
  if (limit <= 0 || tokens_.empty()) return {};
  if (copying_ == Where::kNone) {
    const bool found = (left_at_ >= 0 && Resume(options.min_match)) || Search(options);
    if (!found) return {};
    left_in_ = Where::kNone;
    left_at_ = -1;
  }
  int64_t count = limit;
  if (options.length_factor > 0) {
    // In double, so that any factor (however large) bounds nothing beyond
    // the limit.
    const double bound = std::max(1.0, std::floor(options.length_factor * agreed_));
    if (bound < static_cast<double>(limit)) count = static_cast<int64_t>(bound);
  }
  SuffixDraft draft;
  draft.match = agreed_;
  if (copying_ == Where::kOwn) {
    const auto size = static_cast<int64_t>(tokens_.size());
    const int64_t end = std::min(size, source_ + count);
    draft.tokens.assign(tokens_.begin() + source_, tokens_.begin() + end);
    // The copy's next token is the stream's at `end` once the draft is
    // appended: where the copy reaches the stream's end, a drafted one.
    draft.next = end < size ? tokens_[static_cast<size_t>(end)]
                            : draft.tokens[static_cast<size_t>(end - size)];
  } else {
    const auto size = static_cast<int64_t>(cache_copy_.size());
    const int64_t end = std::min(size, source_ + count);
    draft.tokens.assign(cache_copy_.begin() + source_, cache_copy_.begin() + end);
    draft.source = step::DraftSource::kGlobal;
    // Taking the copy's last token uses it up (Append): then the next draft
    // searches afresh, so a draft ending one short of it has no next either.
    if (end + 1 < size) draft.next = cache_copy_[static_cast<size_t>(end)];
  }
  return draft;
}

SuffixProposer::SuffixProposer(SuffixDraftOptions options, std::shared_ptr<const SuffixCache> cache)
    : options_(options), cache_(std::move(cache)) {
  TANDEM_CHECK(options.min_match >= 1, "the suffix proposer's shortest match must be at least 1");
  TANDEM_CHECK(options.length_factor >= 0, "the suffix proposer's length factor must be >= 0");
  options_.cache = cache_.get();
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
    SuffixDraftOptions options = options_;
    options.salt = s.cache_salt;
    SuffixDraft draft = tracked.matcher.Draft(requests[i].limit, options);
    (*drafts)[i].tokens = std::move(draft.tokens);
    (*drafts)[i].source = draft.source;
    (*drafts)[i].match = draft.match;
    (*drafts)[i].copy_next = draft.next;
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
