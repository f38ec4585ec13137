#include "kvcache/block_hash.h"

#include <openssl/evp.h>

#include <cstring>
#include <memory>

#include "common/check.h"

namespace tandem::kvcache {
namespace {

// One digest context per thread, reused (creating one allocates).
class Sha256 {
 public:
  Sha256() {
    static thread_local std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(
        EVP_MD_CTX_new(), &EVP_MD_CTX_free);
    ctx_ = ctx.get();
    TANDEM_CHECK(ctx_ != nullptr && EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) == 1,
                 "OpenSSL cannot start a SHA-256 digest");
  }

  void Update(const void* data, size_t bytes) {
    TANDEM_CHECK(EVP_DigestUpdate(ctx_, data, bytes) == 1, "SHA-256 update failed");
  }
  void UpdateU64(uint64_t v) {
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(v >> (8 * i));
    Update(le, sizeof(le));
  }
  void UpdateHash(const BlockHash& h) {
    for (uint64_t w : h.words) UpdateU64(w);
  }

  BlockHash Finish() {
    unsigned char digest[32];
    unsigned int size = 0;
    TANDEM_CHECK(EVP_DigestFinal_ex(ctx_, digest, &size) == 1 && size == sizeof(digest),
                 "SHA-256 final failed");
    BlockHash out;
    for (size_t w = 0; w < 4; ++w) {
      for (size_t i = 0; i < 8; ++i) {
        out.words[w] |= static_cast<uint64_t>(digest[8 * w + i]) << (8 * i);
      }
    }
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
};

}  // namespace

BlockHash RootHash(std::string_view salt) {
  static constexpr std::string_view kDomain = "tandem.kv.root";
  Sha256 h;
  h.Update(kDomain.data(), kDomain.size());
  h.UpdateU64(salt.size());
  h.Update(salt.data(), salt.size());
  return h.Finish();
}

BlockHash ChainHash(const BlockHash& parent, std::span<const TokenId> tokens) {
  Sha256 h;
  h.UpdateHash(parent);
  h.UpdateU64(tokens.size());
  unsigned char le[4];
  for (TokenId t : tokens) {
    const auto u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) le[i] = static_cast<unsigned char>(u >> (8 * i));
    h.Update(le, sizeof(le));
  }
  return h.Finish();
}

}  // namespace tandem::kvcache
