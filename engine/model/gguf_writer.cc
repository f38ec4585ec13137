#include "engine/model/gguf_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/strings.h"

namespace tandem::model {
namespace {

constexpr uint64_t kAlignment = 32;  // GGUF's default general.alignment

uint64_t Aligned(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

absl::Status WriteAll(int fd, const uint8_t* data, size_t size) {
  for (size_t done = 0; done < size;) {
    const ssize_t n = write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError(StrCat("writing GGUF: ", std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

template <typename T>
void GgufWriter::Put(T value) {
  const auto* b = reinterpret_cast<const uint8_t*>(&value);
  kv_.insert(kv_.end(), b, b + sizeof(T));
}

void GgufWriter::PutString(const std::string& s) {
  Put(static_cast<uint64_t>(s.size()));
  kv_.insert(kv_.end(), s.begin(), s.end());
}

void GgufWriter::Key(const std::string& key, uint32_t type) {
  ++kv_count_;
  PutString(key);
  Put(type);
}

void GgufWriter::Uint32(const std::string& key, uint32_t value) {
  Key(key, 4);
  Put(value);
}

void GgufWriter::Float32(const std::string& key, float value) {
  Key(key, 6);
  Put(value);
}

void GgufWriter::Bool(const std::string& key, bool value) {
  Key(key, 7);
  Put(static_cast<uint8_t>(value));
}

void GgufWriter::String(const std::string& key, const std::string& value) {
  Key(key, 8);
  PutString(value);
}

void GgufWriter::StringArray(const std::string& key, const std::vector<std::string>& values) {
  Key(key, 9);
  Put(uint32_t{8});
  Put(static_cast<uint64_t>(values.size()));
  for (const std::string& s : values) PutString(s);
}

void GgufWriter::Int32Array(const std::string& key, const std::vector<int32_t>& values) {
  Key(key, 9);
  Put(uint32_t{5});
  Put(static_cast<uint64_t>(values.size()));
  for (int32_t v : values) Put(v);
}

void GgufWriter::Tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                        uint64_t bytes, Fill fill) {
  tensors_.push_back({name, std::move(dims), type, bytes, std::move(fill)});
}

absl::Status GgufWriter::WriteTo(int fd) const {
  std::vector<uint8_t> header;
  // resize + memcpy, not insert(): GCC 12 misreads inserting a 4-byte
  // literal's bytes as an out-of-bounds read (-Warray-bounds).
  auto put = [&header](const void* p, size_t n) {
    const size_t at = header.size();
    header.resize(at + n);
    std::memcpy(header.data() + at, p, n);
  };
  const uint32_t version = 3;
  const uint64_t tensor_count = tensors_.size();
  put("GGUF", 4);
  put(&version, 4);
  put(&tensor_count, 8);
  put(&kv_count_, 8);
  header.insert(header.end(), kv_.begin(), kv_.end());
  uint64_t offset = 0;
  for (const TensorSpec& t : tensors_) {
    const uint64_t length = t.name.size();
    put(&length, 8);
    put(t.name.data(), length);
    const auto rank = static_cast<uint32_t>(t.dims.size());
    put(&rank, 4);
    for (uint64_t d : t.dims) put(&d, 8);
    put(&t.type, 4);
    put(&offset, 8);
    offset += Aligned(t.bytes);
  }
  header.resize(Aligned(header.size()), 0);
  if (absl::Status s = WriteAll(fd, header.data(), header.size()); !s.ok()) return s;
  constexpr uint64_t kChunk = uint64_t{4} << 20;
  std::vector<uint8_t> chunk(kChunk);
  for (const TensorSpec& t : tensors_) {
    for (uint64_t at = 0; at < t.bytes; at += kChunk) {
      const uint64_t n = std::min(kChunk, t.bytes - at);
      t.fill(chunk.data(), at, n);
      if (absl::Status s = WriteAll(fd, chunk.data(), n); !s.ok()) return s;
    }
    const std::vector<uint8_t> padding(Aligned(t.bytes) - t.bytes, 0);
    if (absl::Status s = WriteAll(fd, padding.data(), padding.size()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tandem::model
