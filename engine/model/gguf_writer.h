// Writes GGUF (version 3) files: metadata, then tensors whose bytes a
// callback fills chunk by chunk, so files of many gigabytes (a random model
// of an 8B shape) stream to a descriptor without a copy in memory.
#ifndef TANDEM_ENGINE_MODEL_GGUF_WRITER_H_
#define TANDEM_ENGINE_MODEL_GGUF_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem::model {

// GGML tensor type ids (GGUF's on-disk numbering).
inline constexpr uint32_t kGgmlF32 = 0;
inline constexpr uint32_t kGgmlQ4_0 = 2;

class GgufWriter {
 public:
  // Fills out[0, bytes) with the tensor's bytes at [offset, offset + bytes).
  using Fill = std::function<void(uint8_t* out, uint64_t offset, uint64_t bytes)>;

  void Uint32(const std::string& key, uint32_t value);
  void Float32(const std::string& key, float value);
  void Bool(const std::string& key, bool value);
  void String(const std::string& key, const std::string& value);
  void StringArray(const std::string& key, const std::vector<std::string>& values);
  void Int32Array(const std::string& key, const std::vector<int32_t>& values);
  // dims[0] is the contiguous dimension; `bytes` the tensor's size.
  void Tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t bytes,
              Fill fill);

  // Writes the whole file to `fd` (from its current position).
  absl::Status WriteTo(int fd) const;

 private:
  struct TensorSpec {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    uint64_t bytes;
    Fill fill;
  };
  void Key(const std::string& key, uint32_t type);
  void PutString(const std::string& s);
  template <typename T>
  void Put(T value);

  uint64_t kv_count_ = 0;
  std::vector<uint8_t> kv_;
  std::vector<TensorSpec> tensors_;
};

}  // namespace tandem::model

#endif  // TANDEM_ENGINE_MODEL_GGUF_WRITER_H_
