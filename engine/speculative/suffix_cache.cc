#include "engine/speculative/suffix_cache.h"

#include <algorithm>

#include "common/check.h"

namespace tandem::speculative {

namespace {

// Ends every kept text: no token equals it, so a match stops at the text's
// start and a continuation at its end.
constexpr TokenId kSeparator = -1;

// Occurrences of evicted tokens are dropped from an index list once they are
// this many and at least half of it.
constexpr size_t kCompactAfter = 32;

// The index's key type (this Abseil's string_view is not std's).
absl::string_view Key(std::string_view salt) { return {salt.data(), salt.size()}; }

}  // namespace

// One salt's texts, as one stream of tokens at increasing positions (the
// oldest evicted from the front) and where each token id occurs in it.
struct SuffixCache::Corpus {
  struct Occurrences {
    std::vector<int64_t> positions;  // increasing; those before first_live are evicted
    size_t first_live = 0;
  };
  std::string salt;
  std::deque<TokenId> tokens;  // positions base .. end() - 1
  int64_t base = 0;
  absl::flat_hash_map<TokenId, Occurrences> index;

  int64_t end() const { return base + static_cast<int64_t>(tokens.size()); }
  TokenId At(int64_t position) const { return tokens[static_cast<size_t>(position - base)]; }
};

SuffixCache::SuffixCache(int64_t budget_bytes) : budget_bytes_(budget_bytes) {
  TANDEM_CHECK(budget_bytes > 0, "the suffix cache needs a positive budget");
}

SuffixCache::~SuffixCache() = default;

void SuffixCache::Add(std::string_view salt, std::span<const TokenId> tokens) {
  if (tokens.empty()) return;
  const auto kept = static_cast<int64_t>(tokens.size()) + 1;  // and the separator
  // The most the text can cost on its own: every token a new id.
  const int64_t alone = kBytesPerSalt + static_cast<int64_t>(salt.size()) + kept * kBytesPerToken +
                        static_cast<int64_t>(tokens.size()) * kBytesPerTokenId;
  const bool negative = std::any_of(tokens.begin(), tokens.end(), [](TokenId t) { return t < 0; });
  std::lock_guard<std::mutex> lock(mu_);
  if (alone > budget_bytes_ || negative) {
    ++refused_texts_;
    return;
  }
  std::unique_ptr<Corpus>& slot = corpora_[Key(salt)];
  if (slot == nullptr) {
    slot = std::make_unique<Corpus>();
    slot->salt = std::string(salt);
    slot->base = next_base_;
    bytes_ += kBytesPerSalt + static_cast<int64_t>(salt.size());
  }
  Corpus& corpus = *slot;
  for (TokenId token : tokens) {
    const int64_t position = corpus.end();
    corpus.tokens.push_back(token);
    auto [it, inserted] = corpus.index.try_emplace(token);
    if (inserted) bytes_ += kBytesPerTokenId;
    it->second.positions.push_back(position);
  }
  corpus.tokens.push_back(kSeparator);
  next_base_ = std::max(next_base_, corpus.end());
  bytes_ += kept * kBytesPerToken;
  tokens_ += static_cast<int64_t>(tokens.size());
  texts_.emplace_back(&corpus, kept);
  // The text just kept fits alone, so this stops before evicting it.
  while (bytes_ > budget_bytes_) EvictOldest();
}

void SuffixCache::EvictOldest() {
  auto [kept, count] = texts_.front();
  texts_.pop_front();
  Corpus& corpus = *kept;
  for (int64_t i = 0; i < count; ++i) {
    const TokenId token = corpus.tokens.front();
    corpus.tokens.pop_front();
    ++corpus.base;
    if (token == kSeparator) continue;
    --tokens_;
    // Texts leave in the order they came, so the evicted occurrence is the
    // oldest live one of its token.
    auto entry = corpus.index.find(token);
    Corpus::Occurrences& occurrences = entry->second;
    ++occurrences.first_live;
    if (occurrences.first_live == occurrences.positions.size()) {
      corpus.index.erase(entry);
      bytes_ -= kBytesPerTokenId;
    } else if (occurrences.first_live >= kCompactAfter &&
               2 * occurrences.first_live >= occurrences.positions.size()) {
      occurrences.positions.erase(
          occurrences.positions.begin(),
          occurrences.positions.begin() + static_cast<int64_t>(occurrences.first_live));
      occurrences.first_live = 0;
    }
  }
  bytes_ -= count * kBytesPerToken;
  if (corpus.tokens.empty()) {
    bytes_ -= kBytesPerSalt + static_cast<int64_t>(corpus.salt.size());
    corpora_.erase(Key(corpus.salt));  // destroys the corpus: last use above
  }
  ++evicted_texts_;
}

void SuffixCache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  texts_.clear();
  corpora_.clear();
  bytes_ = 0;
  tokens_ = 0;
}

SuffixCache::Stats SuffixCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats stats;
  stats.budget_bytes = budget_bytes_;
  stats.bytes = bytes_;
  stats.tokens = tokens_;
  stats.texts = static_cast<int64_t>(texts_.size());
  stats.salts = static_cast<int64_t>(corpora_.size());
  stats.evicted_texts = evicted_texts_;
  stats.refused_texts = refused_texts_;
  return stats;
}

SuffixMatch SuffixCache::Longest(std::string_view salt, std::span<const TokenId> tail,
                                 int32_t min_match) const {
  std::lock_guard<std::mutex> lock(mu_);
  return LongestLocked(salt, tail, min_match);
}

std::vector<TokenId> SuffixCache::Continuation(std::string_view salt, int64_t position,
                                               int32_t limit) const {
  std::lock_guard<std::mutex> lock(mu_);
  return ContinuationLocked(salt, position, limit);
}

SuffixCache::Copy SuffixCache::LongestCopy(std::string_view salt, std::span<const TokenId> tail,
                                           int32_t min_match, int32_t limit) const {
  std::lock_guard<std::mutex> lock(mu_);
  const SuffixMatch match = LongestLocked(salt, tail, min_match);
  if (match.position < 0) return {};
  return {match.length, ContinuationLocked(salt, match.position, limit)};
}

SuffixMatch SuffixCache::LongestLocked(std::string_view salt, std::span<const TokenId> tail,
                                       int32_t min_match) const {
  if (tail.empty()) return {};
  auto found = corpora_.find(Key(salt));
  if (found == corpora_.end()) return {};
  const Corpus& corpus = *found->second;
  auto entry = corpus.index.find(tail.back());
  if (entry == corpus.index.end()) return {};
  const Corpus::Occurrences& occurrences = entry->second;
  const auto tail_size = static_cast<int64_t>(tail.size());
  TiedMatches best;
  int32_t checked = 0;
  for (size_t i = occurrences.positions.size();
       i-- > occurrences.first_live && checked < kSuffixMaxCandidates; ++checked) {
    const int64_t start = occurrences.positions[i] + 1;  // < end(): a separator follows
    if (corpus.At(start) == kSeparator) continue;        // nothing to copy
    int32_t length = 0;
    while (length < kSuffixMaxMatch && length < tail_size && start - 1 - length >= corpus.base &&
           corpus.At(start - 1 - length) == tail[static_cast<size_t>(tail_size - 1 - length)]) {
      ++length;
    }
    if (length >= min_match) best.Offer(start, length, corpus.At(start));
  }
  return best.Chosen();
}

void TiedMatches::Offer(int64_t position, int32_t length, TokenId next) {
  if (length < length_) return;
  if (length > length_) {
    length_ = length;
    ties_.clear();
  }
  ties_.emplace_back(position, next);
}

SuffixMatch TiedMatches::Chosen() const {
  if (ties_.empty()) return {};
  // At most kSuffixMaxCandidates ties: counting each one's next token
  // among the rest is cheap, and keeps the first (latest) of a count.
  size_t chosen = 0;
  int32_t chosen_count = 0;
  for (size_t i = 0; i < ties_.size(); ++i) {
    int32_t count = 0;
    for (const auto& [position, next] : ties_) count += next == ties_[i].second ? 1 : 0;
    if (count > chosen_count) {
      chosen = i;
      chosen_count = count;
    }
  }
  return {ties_[chosen].first, length_};
}

std::vector<TokenId> SuffixCache::ContinuationLocked(std::string_view salt, int64_t position,
                                                     int32_t limit) const {
  std::vector<TokenId> out;
  auto found = corpora_.find(Key(salt));
  if (found == corpora_.end()) return out;
  const Corpus& corpus = *found->second;
  if (position < corpus.base) return out;
  for (int64_t p = position; p < corpus.end() && static_cast<int32_t>(out.size()) < limit; ++p) {
    const TokenId token = corpus.At(p);
    if (token == kSeparator) break;
    out.push_back(token);
  }
  return out;
}

}  // namespace tandem::speculative
