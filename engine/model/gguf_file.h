// A read-only, memory-mapped GGUF file (versions 2 and 3).
//
// Open() validates the whole header before anything is used: magic, version,
// counts, string and array lengths, value types, the alignment, and that every
// tensor's dimensions, type, offset and size describe bytes inside the file.
// A file that fails any check yields an InvalidArgument/DataLoss status whose
// message names the file, the byte offset and what is wrong; no check ever
// reads outside the mapping.
//
// Thread safety: immutable after Open(); safe to share between threads.
#ifndef TANDEM_ENGINE_MODEL_GGUF_FILE_H_
#define TANDEM_ENGINE_MODEL_GGUF_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/kernels/dtype.h"

namespace tandem::model {

// Metadata value types, numbered as in the GGUF specification.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view GgufTypeName(GgufType type);

// The ggml tensor type id (GGUF's numbering) of a tensor type.
uint32_t GgmlTypeId(kernels::DType type);

// One metadata value. Strings point into the mapping (valid while the
// GgufFile lives). Arrays hold their elements, all of `element_type`.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  std::variant<uint64_t, int64_t, double, bool, std::string_view> scalar;
  GgufType element_type = GgufType::kUint8;  // arrays only
  std::vector<GgufValue> elements;           // arrays only
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;  // dims[0] is the contiguous (row) dimension
  kernels::DType dtype;
  uint64_t offset = 0;  // from the start of the data section
  size_t bytes = 0;     // validated to lie inside the file
  const uint8_t* data = nullptr;

  int64_t Elements() const;
  int64_t Rows() const { return dims.empty() ? 0 : Elements() / dims[0]; }
};

class GgufFile {
 public:
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t file_bytes() const { return size_; }

  bool Has(std::string_view key) const { return Find(key) != nullptr; }
  const GgufValue* Find(std::string_view key) const;

  // Typed getters: NotFound when absent, InvalidArgument naming the key and
  // both types when the stored type does not convert without loss.
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  absl::StatusOr<std::vector<std::string_view>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(std::string_view name) const;

  // Drops this process's resident pages of `tensor` (the whole pages inside
  // it): for a tensor a backend has copied into a layout of its own. The
  // mapping is private and read-only, so a later read faults the bytes back
  // in from the file, unchanged (an embedding lookup reads only its rows).
  void ReleasePages(const GgufTensor& tensor) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  absl::flat_hash_map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace tandem::model

#endif  // TANDEM_ENGINE_MODEL_GGUF_FILE_H_
