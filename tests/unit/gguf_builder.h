// Builds small GGUF files byte by byte, for tests that need valid files to
// start from and corrupt ones to reject.
#ifndef TANDEM_TESTS_UNIT_GGUF_BUILDER_H_
#define TANDEM_TESTS_UNIT_GGUF_BUILDER_H_

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace tandem::testing {

class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}

  GgufBuilder& Uint32(const std::string& key, uint32_t v) {
    Key(key, 4);
    Put(v);
    return *this;
  }
  GgufBuilder& Float32(const std::string& key, float v) {
    Key(key, 6);
    Put(v);
    return *this;
  }
  GgufBuilder& Bool(const std::string& key, bool v) {
    Key(key, 7);
    Put(static_cast<uint8_t>(v));
    return *this;
  }
  GgufBuilder& String(const std::string& key, const std::string& v) {
    Key(key, 8);
    PutString(v);
    return *this;
  }
  GgufBuilder& StringArray(const std::string& key, const std::vector<std::string>& v) {
    Key(key, 9);
    Put(uint32_t{8});
    Put(static_cast<uint64_t>(v.size()));
    for (const std::string& s : v) PutString(s);
    return *this;
  }
  GgufBuilder& Int32Array(const std::string& key, const std::vector<int32_t>& v) {
    Key(key, 9);
    Put(uint32_t{5});
    Put(static_cast<uint64_t>(v.size()));
    for (int32_t x : v) Put(x);
    return *this;
  }
  GgufBuilder& BoolArray(const std::string& key, const std::vector<bool>& v) {
    Key(key, 9);
    Put(uint32_t{7});
    Put(static_cast<uint64_t>(v.size()));
    for (bool x : v) Put(static_cast<uint8_t>(x));
    return *this;
  }
  GgufBuilder& Float32Array(const std::string& key, const std::vector<float>& v) {
    Key(key, 9);
    Put(uint32_t{6});
    Put(static_cast<uint64_t>(v.size()));
    for (float x : v) Put(x);
    return *this;
  }
  // A tensor with dims (dims[0] contiguous), ggml type id and raw data.
  GgufBuilder& Tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                      std::vector<uint8_t> data) {
    tensors_.push_back({name, std::move(dims), type, std::move(data), -1});
    return *this;
  }
  // Writes `offset` as the last tensor's data offset instead of the right one.
  GgufBuilder& WithOffset(uint64_t offset) {
    tensors_.back().forced_offset = static_cast<int64_t>(offset);
    return *this;
  }

  std::vector<uint8_t> Build(uint32_t alignment = 32) const {
    std::vector<uint8_t> out;
    auto put = [&out](const void* p, size_t n) {
      const auto* b = static_cast<const uint8_t*>(p);
      out.insert(out.end(), b, b + n);
    };
    put("GGUF", 4);
    put(&version_, 4);
    const uint64_t tensor_count = tensors_.size();
    put(&tensor_count, 8);
    put(&kv_count_, 8);
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      const uint64_t len = t.name.size();
      put(&len, 8);
      put(t.name.data(), len);
      const uint32_t rank = static_cast<uint32_t>(t.dims.size());
      put(&rank, 4);
      for (uint64_t d : t.dims) put(&d, 8);
      put(&t.type, 4);
      const uint64_t written =
          t.forced_offset >= 0 ? static_cast<uint64_t>(t.forced_offset) : offset;
      put(&written, 8);
      offsets.push_back(offset);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    while (out.size() % alignment != 0) out.push_back(0);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out.insert(out.end(), tensors_[i].data.begin(), tensors_[i].data.end());
      while (out.size() % alignment != 0) out.push_back(0);
    }
    return out;
  }

 private:
  struct TensorSpec {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::vector<uint8_t> data;
    int64_t forced_offset;
  };
  template <typename T>
  void Put(T v) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    kv_.insert(kv_.end(), b, b + sizeof(T));
  }
  void PutString(const std::string& s) {
    Put(static_cast<uint64_t>(s.size()));
    kv_.insert(kv_.end(), s.begin(), s.end());
  }
  void Key(const std::string& key, uint32_t type) {
    ++kv_count_;
    PutString(key);
    Put(type);
  }

  uint32_t version_;
  uint64_t kv_count_ = 0;
  std::vector<uint8_t> kv_;
  std::vector<TensorSpec> tensors_;
};

inline void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

// A file written for one test and removed when it goes out of scope (a
// GgufFile opened from it maps it, and the mapping outlives the name).
class ScopedFile {
 public:
  ScopedFile(std::string path, const std::vector<uint8_t>& bytes) : path_(std::move(path)) {
    WriteFile(path_, bytes);
  }
  ~ScopedFile() { std::remove(path_.c_str()); }
  ScopedFile(const ScopedFile&) = delete;
  ScopedFile& operator=(const ScopedFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UNIT_GGUF_BUILDER_H_
