// Random identifiers (request ids, OpenAI completion ids, tool-call ids) and
// the seeds of requests that give none.
//
// Lowercase hex digits from a per-thread 64-bit Mersenne Twister seeded from
// std::random_device. They tell requests and calls apart in logs and let a
// client match a tool result to its call; they are not secrets (never use one
// as a token or key).
#ifndef TANDEM_COMMON_RANDOM_ID_H_
#define TANDEM_COMMON_RANDOM_ID_H_

#include <cstdint>
#include <random>
#include <string>
#include <string_view>

namespace tandem {

// 64 random bits (also the seed of a request that gives none).
inline uint64_t RandomU64() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

// `prefix` followed by `digits` random hex digits.
inline std::string RandomHexId(std::string_view prefix, int digits) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string id(prefix);
  uint64_t bits = 0;
  for (int i = 0; i < digits; ++i, bits >>= 4) {
    if (i % 16 == 0) bits = RandomU64();
    id.push_back(kDigits[bits & 15]);
  }
  return id;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_RANDOM_ID_H_
