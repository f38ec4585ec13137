#include "engine/model/file_type.h"

#include <array>
#include <string>

#include "absl/strings/ascii.h"
#include "common/strings.h"

namespace tandem::model {
namespace {

using kernels::DType;

struct FileTypeRow {
  FileType type;
  std::string_view name;
  uint32_t llama_id;
  DType base;  // what most matrices get
};

constexpr std::array<FileTypeRow, 8> kFileTypes = {{
    {FileType::kF32, "F32", 0, DType::kF32},
    {FileType::kF16, "F16", 1, DType::kF16},
    {FileType::kBF16, "BF16", 32, DType::kBF16},
    {FileType::kQ8_0, "Q8_0", 7, DType::kQ8_0},
    {FileType::kQ6_K, "Q6_K", 18, DType::kQ6_K},
    {FileType::kQ5_K_M, "Q5_K_M", 17, DType::kQ5_K},
    {FileType::kQ4_K_M, "Q4_K_M", 15, DType::kQ4_K},
    {FileType::kIQ4_XS, "IQ4_XS", 30, DType::kIQ4_XS},
}};

const FileTypeRow& Row(FileType type) {
  for (const FileTypeRow& row : kFileTypes) {
    if (row.type == type) return row;
  }
  return kFileTypes[0];
}

bool Contains(std::string_view name, std::string_view part) {
  return name.find(part) != std::string_view::npos;
}

bool IsQuantized(DType type) {
  return type != DType::kF32 && type != DType::kF16 && type != DType::kBF16;
}

// A type whose block does not divide the row falls back to a 32-element one.
DType Fallback(DType type, int64_t row_length) {
  if (row_length % kernels::Info(type).block_elements == 0) return type;
  DType smaller = DType::kF16;
  if (type == DType::kQ4_K) smaller = DType::kQ5_0;
  if (type == DType::kQ5_K) smaller = DType::kQ5_1;
  if (type == DType::kQ6_K) smaller = DType::kQ8_0;
  if (type == DType::kIQ4_XS) smaller = DType::kIQ4_NL;
  if (type == DType::kQ8_0 || type == DType::kQ5_0 || type == DType::kQ5_1) smaller = type;
  return row_length % kernels::Info(smaller).block_elements == 0 ? smaller : DType::kF16;
}

}  // namespace

absl::StatusOr<FileType> ParseFileType(std::string_view name) {
  const std::string upper = absl::AsciiStrToUpper(AbslView(name));
  std::string known;
  for (const FileTypeRow& row : kFileTypes) {
    if (row.name == upper) return row.type;
    known = StrCat(known, known.empty() ? "" : ", ", row.name);
  }
  return absl::InvalidArgumentError(
      StrCat("--type=", name, ": not a file type this writes (known: ", known, ")"));
}

std::string_view FileTypeName(FileType type) { return Row(type).name; }

uint32_t LlamaFileTypeId(FileType type) { return Row(type).llama_id; }

bool UseMoreBits(int layer, int layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

DType TensorTypeFor(FileType type, const TensorPlace& place) {
  const std::string_view name = place.name;
  const bool matrix = place.rank >= 2 && name.ends_with("weight") &&
                      !Contains(name, "_norm.weight") && !Contains(name, "ffn_gate_inp.weight");
  if (!matrix) return DType::kF32;
  const DType base = Row(type).base;
  if (!IsQuantized(base)) return base;
  DType chosen = base;
  const bool output =
      name == "output.weight" || (place.tied_embeddings && name == "token_embd.weight");
  const bool mixture = type == FileType::kQ4_K_M || type == FileType::kQ5_K_M;
  if (output) {
    if (place.row_length % kernels::Info(base).block_elements != 0) {
      return Fallback(DType::kQ8_0, place.row_length);
    }
    if (base != DType::kQ8_0) chosen = DType::kQ6_K;
  } else if (mixture &&
             (Contains(name, "attn_v.weight") || Contains(name, "attn_qkv.weight") ||
              Contains(name, "ffn_down")) &&
             UseMoreBits(place.layer, place.layers)) {
    chosen = DType::kQ6_K;
  } else if (type == FileType::kIQ4_XS) {
    const bool value = Contains(name, "attn_v.weight") || Contains(name, "attn_qkv.weight");
    if ((value && place.query_heads_per_kv_head >= 4) ||
        (Contains(name, "ffn_down") && place.layer < place.layers / 8)) {
      chosen = DType::kQ5_K;
    }
  }
  return Fallback(chosen, place.row_length);
}

}  // namespace tandem::model
