#include "engine/model/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "common/strings.h"

namespace tandem::model {
namespace {

using kernels::DType;

constexpr uint32_t kDefaultAlignment = 32;
// Limits far above any real model, so that a corrupt count is rejected
// before it drives a huge allocation.
constexpr uint64_t kMaxTensors = 1u << 20;
constexpr uint64_t kMaxMetadata = 1u << 20;
constexpr uint32_t kMaxDims = 4;
constexpr int kMaxArrayNesting = 4;

// ggml's tensor type ids (GGUF's numbering) of the types we read.
constexpr std::array<std::pair<uint32_t, DType>, 13> kGgmlTypes = {{
    {0, DType::kF32},
    {1, DType::kF16},
    {2, DType::kQ4_0},
    {3, DType::kQ4_1},
    {6, DType::kQ5_0},
    {7, DType::kQ5_1},
    {8, DType::kQ8_0},
    {12, DType::kQ4_K},
    {13, DType::kQ5_K},
    {14, DType::kQ6_K},
    {20, DType::kIQ4_NL},
    {23, DType::kIQ4_XS},
    {30, DType::kBF16},
}};

// Maps a ggml tensor type id to our DType; unsupported ids are errors.
absl::StatusOr<DType> DTypeFromGgml(uint32_t id) {
  for (const auto& [ggml_id, dtype] : kGgmlTypes) {
    if (ggml_id == id) return dtype;
  }
  return absl::UnimplementedError(
      StrCat("tensor type ", id,
             " is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
             "Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)"));
}

// A bounds-checked reader over the mapping. Every read either succeeds
// completely or returns an error naming the offset; it never reads past end.
class Cursor {
 public:
  Cursor(const uint8_t* base, size_t size) : base_(base), size_(size) {}

  size_t offset() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  absl::Status Read(T* out, std::string_view what) {
    if (remaining() < sizeof(T)) return Truncated(what, sizeof(T));
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string_view* out, std::string_view what) {
    uint64_t length = 0;
    if (auto s = Read(&length, what); !s.ok()) return s;
    if (length > remaining()) {
      return absl::DataLossError(StrCat("at byte ", pos_ - 8, ": ", what, " has length ", length,
                                        " but only ", remaining(), " bytes remain in the file"));
    }
    *out = std::string_view(reinterpret_cast<const char*>(base_ + pos_), length);
    pos_ += length;
    return absl::OkStatus();
  }

  absl::Status Truncated(std::string_view what, size_t need) const {
    return absl::DataLossError(StrCat("file truncated at byte ", pos_, " while reading ", what,
                                      " (need ", need, " bytes, ", remaining(), " remain)"));
  }

 private:
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
};

// Smallest encoded size of one value of `type` (strings: their length field).
size_t MinEncodedBytes(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kString:
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kArray:
      return 12;
  }
  return 1;
}

bool IsKnownType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }

// Reads one little-endian scalar of wire type W and stores it as S.
template <typename W, typename S>
absl::Status ReadScalar(Cursor& cursor, std::string_view what, GgufValue* out) {
  W v{};
  if (absl::Status s = cursor.Read(&v, what); !s.ok()) return s;
  out->scalar = static_cast<S>(v);
  return absl::OkStatus();
}

absl::Status ReadValue(Cursor& cursor, GgufType type, std::string_view key, int depth,
                       GgufValue* out) {
  out->type = type;
  const std::string what = StrCat("value of '", key, "'");
  switch (type) {
    case GgufType::kUint8:
      return ReadScalar<uint8_t, uint64_t>(cursor, what, out);
    case GgufType::kUint16:
      return ReadScalar<uint16_t, uint64_t>(cursor, what, out);
    case GgufType::kUint32:
      return ReadScalar<uint32_t, uint64_t>(cursor, what, out);
    case GgufType::kUint64:
      return ReadScalar<uint64_t, uint64_t>(cursor, what, out);
    case GgufType::kInt8:
      return ReadScalar<int8_t, int64_t>(cursor, what, out);
    case GgufType::kInt16:
      return ReadScalar<int16_t, int64_t>(cursor, what, out);
    case GgufType::kInt32:
      return ReadScalar<int32_t, int64_t>(cursor, what, out);
    case GgufType::kInt64:
      return ReadScalar<int64_t, int64_t>(cursor, what, out);
    case GgufType::kFloat32:
      return ReadScalar<float, double>(cursor, what, out);
    case GgufType::kFloat64:
      return ReadScalar<double, double>(cursor, what, out);
    case GgufType::kBool: {
      uint8_t v = 0;
      if (auto s = cursor.Read(&v, what); !s.ok()) return s;
      if (v > 1) {
        return absl::DataLossError(StrCat("at byte ", cursor.offset() - 1, ": ", what,
                                          " is a bool with invalid value ", int{v}));
      }
      out->scalar = v == 1;
      return absl::OkStatus();
    }
    case GgufType::kString: {
      std::string_view v;
      if (auto s = cursor.ReadString(&v, what); !s.ok()) return s;
      out->scalar = v;
      return absl::OkStatus();
    }
    case GgufType::kArray: {
      if (depth >= kMaxArrayNesting) {
        return absl::DataLossError(StrCat("at byte ", cursor.offset(), ": ", what,
                                          " nests arrays deeper than ", kMaxArrayNesting));
      }
      uint32_t element_type = 0;
      uint64_t count = 0;
      if (auto s = cursor.Read(&element_type, what); !s.ok()) return s;
      if (!IsKnownType(element_type)) {
        return absl::DataLossError(StrCat("at byte ", cursor.offset() - 4, ": ", what,
                                          " is an array of unknown type ", element_type));
      }
      if (auto s = cursor.Read(&count, what); !s.ok()) return s;
      const GgufType elem = static_cast<GgufType>(element_type);
      if (count > cursor.remaining() / MinEncodedBytes(elem)) {
        return absl::DataLossError(StrCat("at byte ", cursor.offset() - 8, ": ", what, " claims ",
                                          count, " elements of type ", GgufTypeName(elem),
                                          " but only ", cursor.remaining(), " bytes remain"));
      }
      out->element_type = elem;
      out->elements.resize(count);
      for (uint64_t i = 0; i < count; ++i) {
        if (auto s = ReadValue(cursor, elem, key, depth + 1, &out->elements[i]); !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unreachable");
}

absl::Status WrongType(std::string_view key, const GgufValue& v, std::string_view wanted) {
  return absl::InvalidArgumentError(
      StrCat("metadata key '", key, "' has type ", GgufTypeName(v.type), ", expected ", wanted));
}

}  // namespace

uint32_t GgmlTypeId(DType type) {
  for (const auto& [ggml_id, dtype] : kGgmlTypes) {
    if (dtype == type) return ggml_id;
  }
  return 0;  // unreachable: every DType has an id
}

std::string_view GgufTypeName(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
      return "uint8";
    case GgufType::kInt8:
      return "int8";
    case GgufType::kUint16:
      return "uint16";
    case GgufType::kInt16:
      return "int16";
    case GgufType::kUint32:
      return "uint32";
    case GgufType::kInt32:
      return "int32";
    case GgufType::kFloat32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "uint64";
    case GgufType::kInt64:
      return "int64";
    case GgufType::kFloat64:
      return "float64";
  }
  return "unknown";
}

int64_t GgufTensor::Elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        StrCat("cannot open model file '", path, "': ", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(StrCat("cannot stat '", path, "': ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(StrCat("'", path, "' is not a regular file"));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* map = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InternalError(StrCat("cannot map '", path, "': ", std::strerror(err)));
    }
    file->base_ = static_cast<const uint8_t*>(map);
  }
  ::close(fd);
  if (absl::Status s = file->Parse(); !s.ok()) {
    return absl::Status(s.code(), StrCat("invalid GGUF file '", path, "': ", s.message()));
  }
  return file;
}

void GgufFile::ReleasePages(const GgufTensor& tensor) const {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(tensor.data);
  const uintptr_t first = (begin + page - 1) / page * page;
  const uintptr_t last = (begin + tensor.bytes) / page * page;
  if (last > first) {
    // Advice only: if the kernel declines, the pages simply stay resident.
    (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
  }
}

GgufFile::~GgufFile() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
}

absl::Status GgufFile::Parse() {
  Cursor cursor(base_, size_);
  uint32_t magic = 0;
  if (auto s = cursor.Read(&magic, "the magic number"); !s.ok()) return s;
  if (std::memcmp(&magic, "GGUF", 4) != 0) {
    return absl::InvalidArgumentError("bad magic number: this is not a GGUF file");
  }
  if (auto s = cursor.Read(&version_, "the version"); !s.ok()) return s;
  if (version_ != 2 && version_ != 3) {
    return absl::InvalidArgumentError(
        StrCat("GGUF version ", version_, " is not supported (supported: 2 and 3)"));
  }
  uint64_t tensor_count = 0;
  uint64_t metadata_count = 0;
  if (auto s = cursor.Read(&tensor_count, "the tensor count"); !s.ok()) return s;
  if (auto s = cursor.Read(&metadata_count, "the metadata count"); !s.ok()) return s;
  if (tensor_count > kMaxTensors) {
    return absl::DataLossError(
        StrCat("tensor count ", tensor_count, " exceeds the limit ", kMaxTensors));
  }
  if (metadata_count > kMaxMetadata) {
    return absl::DataLossError(
        StrCat("metadata count ", metadata_count, " exceeds the limit ", kMaxMetadata));
  }

  for (uint64_t i = 0; i < metadata_count; ++i) {
    const size_t entry_offset = cursor.offset();
    std::string_view key;
    if (auto s = cursor.ReadString(&key, StrCat("metadata key #", i)); !s.ok()) return s;
    uint32_t type = 0;
    if (auto s = cursor.Read(&type, StrCat("the type of '", key, "'")); !s.ok()) return s;
    if (!IsKnownType(type)) {
      return absl::DataLossError(StrCat("at byte ", cursor.offset() - 4, ": metadata key '", key,
                                        "' has unknown type ", type));
    }
    GgufValue value;
    if (auto s = ReadValue(cursor, static_cast<GgufType>(type), key, 0, &value); !s.ok()) {
      return s;
    }
    if (!metadata_.emplace(std::string(key), std::move(value)).second) {
      return absl::DataLossError(
          StrCat("at byte ", entry_offset, ": metadata key '", key, "' appears twice"));
    }
  }

  uint64_t alignment = kDefaultAlignment;
  if (Has("general.alignment")) {
    absl::StatusOr<uint64_t> a = GetUint("general.alignment");
    if (!a.ok()) return a.status();
    alignment = *a;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > (1u << 20)) {
      return absl::DataLossError(
          StrCat("general.alignment ", alignment, " is not a power of two up to 1 MiB"));
    }
  }

  tensors_.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    const size_t info_offset = cursor.offset();
    std::string_view name;
    if (auto s = cursor.ReadString(&name, StrCat("the name of tensor #", i)); !s.ok()) {
      return s;
    }
    GgufTensor tensor;
    tensor.name = std::string(name);
    const std::string where = StrCat("tensor '", tensor.name, "'");
    uint32_t n_dims = 0;
    if (auto s = cursor.Read(&n_dims, StrCat("the rank of ", where)); !s.ok()) return s;
    if (n_dims == 0 || n_dims > kMaxDims) {
      return absl::DataLossError(StrCat("at byte ", info_offset, ": ", where, " has rank ", n_dims,
                                        " (must be 1..", kMaxDims, ")"));
    }
    int64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      if (auto s = cursor.Read(&dim, StrCat("the dimensions of ", where)); !s.ok()) {
        return s;
      }
      if (dim == 0 || dim > (uint64_t{1} << 40) ||
          static_cast<uint64_t>(elements) > (uint64_t{1} << 48) / dim) {
        return absl::DataLossError(
            StrCat("at byte ", info_offset, ": ", where, " has an invalid dimension ", dim));
      }
      elements *= static_cast<int64_t>(dim);
      tensor.dims.push_back(static_cast<int64_t>(dim));
    }
    uint32_t type_id = 0;
    if (auto s = cursor.Read(&type_id, StrCat("the type of ", where)); !s.ok()) return s;
    absl::StatusOr<DType> dtype = DTypeFromGgml(type_id);
    if (!dtype.ok()) {
      return absl::Status(dtype.status().code(), StrCat(where, ": ", dtype.status().message()));
    }
    tensor.dtype = *dtype;
    const kernels::DTypeInfo& info = kernels::Info(tensor.dtype);
    if (tensor.dims[0] % info.block_elements != 0) {
      return absl::DataLossError(StrCat(where, " has rows of ", tensor.dims[0],
                                        " elements, not a multiple of the ", info.name,
                                        " block size ", info.block_elements));
    }
    if (auto s = cursor.Read(&tensor.offset, StrCat("the offset of ", where)); !s.ok()) {
      return s;
    }
    if (tensor.offset % alignment != 0) {
      return absl::DataLossError(StrCat(where, " has offset ", tensor.offset,
                                        ", not a multiple of the alignment ", alignment));
    }
    tensor.bytes = kernels::RowBytes(tensor.dtype, elements);
    if (!tensor_index_.emplace(tensor.name, tensors_.size()).second) {
      return absl::DataLossError(StrCat("at byte ", info_offset, ": ", where, " appears twice"));
    }
    tensors_.push_back(std::move(tensor));
  }

  const size_t data_start = (cursor.offset() + alignment - 1) / alignment * alignment;
  const size_t data_bytes = data_start <= size_ ? size_ - data_start : 0;
  for (GgufTensor& tensor : tensors_) {
    if (tensor.offset > data_bytes || tensor.bytes > data_bytes - tensor.offset) {
      return absl::DataLossError(
          StrCat("tensor '", tensor.name, "' (", tensor.bytes, " bytes at data offset ",
                 tensor.offset, ") extends past the end of the file: the data section holds ",
                 data_bytes, " bytes (file truncated?)"));
    }
    tensor.data = base_ + data_start + tensor.offset;
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_.find(AbslView(key));
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(AbslView(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(StrCat("metadata key '", key, "' is missing"));
  if (const uint64_t* u = std::get_if<uint64_t>(&v->scalar); u && v->type != GgufType::kArray) {
    return *u;
  }
  if (const int64_t* i = std::get_if<int64_t>(&v->scalar); i && v->type != GgufType::kArray) {
    if (*i >= 0) return static_cast<uint64_t>(*i);
    return absl::InvalidArgumentError(StrCat("metadata key '", key, "' is negative (", *i, ")"));
  }
  return WrongType(key, *v, "an unsigned integer");
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(StrCat("metadata key '", key, "' is missing"));
  if (v->type == GgufType::kArray) return WrongType(key, *v, "a number");
  if (const double* d = std::get_if<double>(&v->scalar)) return *d;
  if (const uint64_t* u = std::get_if<uint64_t>(&v->scalar)) return static_cast<double>(*u);
  if (const int64_t* i = std::get_if<int64_t>(&v->scalar)) return static_cast<double>(*i);
  return WrongType(key, *v, "a number");
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(StrCat("metadata key '", key, "' is missing"));
  if (v->type != GgufType::kBool) return WrongType(key, *v, "bool");
  return std::get<bool>(v->scalar);
}

absl::StatusOr<std::string_view> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(StrCat("metadata key '", key, "' is missing"));
  if (v->type != GgufType::kString) return WrongType(key, *v, "string");
  return std::get<std::string_view>(v->scalar);
}

absl::StatusOr<std::vector<std::string_view>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(StrCat("metadata key '", key, "' is missing"));
  if (v->type != GgufType::kArray || v->element_type != GgufType::kString) {
    return WrongType(key, *v, "array of string");
  }
  std::vector<std::string_view> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements) out.push_back(std::get<std::string_view>(e.scalar));
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(StrCat("metadata key '", key, "' is missing"));
  if (v->type != GgufType::kArray) return WrongType(key, *v, "array of integers");
  std::vector<int64_t> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements) {
    if (const int64_t* i = std::get_if<int64_t>(&e.scalar)) {
      out.push_back(*i);
    } else if (const uint64_t* u = std::get_if<uint64_t>(&e.scalar);
               u && *u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      out.push_back(static_cast<int64_t>(*u));
    } else {
      return absl::InvalidArgumentError(StrCat("metadata key '", key, "' is an array of ",
                                               GgufTypeName(v->element_type),
                                               ", expected integers"));
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(StrCat("metadata key '", key, "' is missing"));
  if (v->type != GgufType::kArray ||
      (v->element_type != GgufType::kFloat32 && v->element_type != GgufType::kFloat64)) {
    return WrongType(key, *v, "array of float");
  }
  std::vector<float> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements)
    out.push_back(static_cast<float>(std::get<double>(e.scalar)));
  return out;
}

}  // namespace tandem::model
