#include "engine/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <queue>

#include "absl/status/status.h"
#include "common/strings.h"
#include "engine/tokenizer/byte_map.h"
#include "engine/tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

absl::StatusOr<std::optional<TokenId>> ReadSpecialId(const model::GgufFile& file,
                                                     std::string_view key, int vocab) {
  if (!file.Has(key)) return std::optional<TokenId>();
  absl::StatusOr<uint64_t> id = file.GetUint(key);
  if (!id.ok()) return id.status();
  if (*id >= static_cast<uint64_t>(vocab)) {
    return absl::InvalidArgumentError(
        StrCat("metadata key '", key, "' is ", *id, ", outside the vocabulary of ", vocab));
  }
  return std::optional<TokenId>(static_cast<TokenId>(*id));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromGguf(const model::GgufFile& file) {
  absl::StatusOr<std::string_view> model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  if (*model != "gpt2") {
    return absl::UnimplementedError(StrCat("tokenizer model '", *model,
                                           "' is not supported (supported: gpt2, i.e. "
                                           "byte-level BPE)"));
  }
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  std::string_view pre_name = "default";
  if (file.Has("tokenizer.ggml.pre")) {
    absl::StatusOr<std::string_view> pre = file.GetString("tokenizer.ggml.pre");
    if (!pre.ok()) return pre.status();
    pre_name = *pre;
  }
  absl::StatusOr<PretokenizerKind> kind = PretokenizerFromGgufName(pre_name);
  if (!kind.ok()) return kind.status();
  t->pretokenizer_ = *kind;

  absl::StatusOr<std::vector<std::string_view>> tokens =
      file.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  const int vocab = static_cast<int>(tokens->size());
  if (vocab == 0) return absl::InvalidArgumentError("tokenizer.ggml.tokens is empty");
  std::vector<int64_t> types(static_cast<size_t>(vocab), static_cast<int64_t>(TokenKind::kNormal));
  if (file.Has("tokenizer.ggml.token_type")) {
    absl::StatusOr<std::vector<int64_t>> read = file.GetIntArray("tokenizer.ggml.token_type");
    if (!read.ok()) return read.status();
    if (read->size() != tokens->size()) {
      return absl::InvalidArgumentError(StrCat("tokenizer.ggml.token_type has ", read->size(),
                                               " entries for ", vocab, " tokens"));
    }
    types = *std::move(read);
  }

  const std::array<char32_t, 256> byte_map = ByteToCodePoint();
  absl::flat_hash_map<char32_t, uint8_t> code_point_to_byte;
  for (int b = 0; b < 256; ++b)
    code_point_to_byte[byte_map[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);

  t->token_bytes_.resize(static_cast<size_t>(vocab));
  t->kinds_.resize(static_cast<size_t>(vocab));
  t->vocab_.reserve(static_cast<size_t>(vocab));
  for (int id = 0; id < vocab; ++id) {
    const std::string_view text = (*tokens)[static_cast<size_t>(id)];
    const int64_t type = types[static_cast<size_t>(id)];
    if (type < 1 || type > 6) {
      return absl::InvalidArgumentError(StrCat("token ", id, " has unknown type ", type));
    }
    const auto token_kind = static_cast<TokenKind>(type);
    t->kinds_[static_cast<size_t>(id)] = token_kind;
    std::string& bytes = t->token_bytes_[static_cast<size_t>(id)];
    if (token_kind == TokenKind::kControl || token_kind == TokenKind::kUserDefined) {
      bytes = std::string(text);
      if (!text.empty()) {
        t->specials_by_length_.emplace_back(std::string(text), id);
        t->special_first_byte_[static_cast<unsigned char>(text[0])] = true;
      }
    } else {
      for (const CodePoint& cp : DecodeUtf8(text)) {
        auto it = code_point_to_byte.find(cp.value);
        if (it != code_point_to_byte.end()) {
          bytes.push_back(static_cast<char>(it->second));
        } else {
          bytes.append(text.substr(cp.offset, cp.length));  // not byte-level: keep as text
        }
      }
    }
    t->vocab_.emplace(std::string(text), id);  // first id wins for duplicate texts
  }
  std::stable_sort(t->specials_by_length_.begin(), t->specials_by_length_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

  int byte_tokens = 0;
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    AppendUtf8(byte_map[static_cast<size_t>(b)], &symbol);
    auto it = t->vocab_.find(symbol);
    t->byte_token_[b] = it == t->vocab_.end() ? -1 : it->second;
    if (it != t->vocab_.end()) ++byte_tokens;
  }

  // Byte-level vocabularies cover (almost) every byte; some omit bytes never
  // seen in training (rare control characters, bytes invalid in UTF-8).
  if (byte_tokens < 128) {
    return absl::InvalidArgumentError(StrCat("the vocabulary has tokens for only ", byte_tokens,
                                             " of 256 bytes: not a byte-level BPE vocabulary"));
  }

  absl::StatusOr<std::vector<std::string_view>> merges =
      file.GetStringArray("tokenizer.ggml.merges");
  if (!merges.ok()) return merges.status();
  t->merges_.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const std::string_view merge = (*merges)[rank];
    const size_t space = merge.find(' ', 1);
    if (space == std::string_view::npos) {
      return absl::InvalidArgumentError(
          StrCat("merge #", rank, " ('", merge, "') is not two tokens separated by a space"));
    }
    const std::string left(merge.substr(0, space));
    const std::string right(merge.substr(space + 1));
    auto l = t->vocab_.find(left);
    auto r = t->vocab_.find(right);
    auto m = t->vocab_.find(left + right);
    if (l == t->vocab_.end() || r == t->vocab_.end() || m == t->vocab_.end()) {
      return absl::InvalidArgumentError(
          StrCat("merge #", rank, " ('", merge, "') refers to a token not in the vocabulary"));
    }
    t->merges_.try_emplace(PairKey(l->second, r->second),
                           Merge{static_cast<int32_t>(rank), m->second});
  }

  for (auto [key, field] : {std::pair{"tokenizer.ggml.bos_token_id", &t->special_.bos},
                            std::pair{"tokenizer.ggml.eos_token_id", &t->special_.eos},
                            std::pair{"tokenizer.ggml.eot_token_id", &t->special_.eot},
                            std::pair{"tokenizer.ggml.unknown_token_id", &t->special_.unknown},
                            std::pair{"tokenizer.ggml.padding_token_id", &t->special_.padding}}) {
    absl::StatusOr<std::optional<TokenId>> id = ReadSpecialId(file, key, vocab);
    if (!id.ok()) return id.status();
    *field = *id;
  }
  if (file.Has("tokenizer.ggml.add_bos_token")) {
    absl::StatusOr<bool> add = file.GetBool("tokenizer.ggml.add_bos_token");
    if (!add.ok()) return add.status();
    t->add_bos_ = *add && t->special_.bos.has_value();
  }
  return t;
}

std::vector<TokenId> BpeTokenizer::Encode(std::string_view text, bool parse_special) const {
  if (!parse_special || specials_by_length_.empty()) {
    std::vector<TokenId> out;
    EncodePlain(text, &out);
    return out;
  }
  return EncodeSpecialWhere(text, [](size_t) { return true; });
}

std::vector<TokenId> BpeTokenizer::EncodeSpecialWhere(
    std::string_view text, const std::function<bool(size_t)>& special_allowed) const {
  std::vector<TokenId> out;
  size_t plain_start = 0;
  size_t i = 0;
  while (i < text.size()) {
    const std::pair<std::string, TokenId>* match = nullptr;
    if (special_first_byte_[static_cast<unsigned char>(text[i])] && special_allowed(i)) {
      for (const auto& special : specials_by_length_) {
        if (text.compare(i, special.first.size(), special.first) == 0) {
          match = &special;
          break;
        }
      }
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    EncodePlain(text.substr(plain_start, i - plain_start), &out);
    out.push_back(match->second);
    i += match->first.size();
    plain_start = i;
  }
  EncodePlain(text.substr(plain_start), &out);
  return out;
}

void BpeTokenizer::EncodePlain(std::string_view text, std::vector<TokenId>* out) const {
  if (text.empty()) return;
  for (std::string_view piece : Pretokenize(pretokenizer_, text)) EncodePiece(piece, out);
}

void BpeTokenizer::EncodePiece(std::string_view piece, std::vector<TokenId>* out) const {
  // Symbols form a doubly linked list over the piece's bytes; candidate merges
  // sit in a heap ordered by (rank, position) and are checked when popped.
  struct Symbol {
    TokenId id;
    int prev, next;
  };
  struct Candidate {
    int32_t rank;
    int left;
    TokenId left_id, right_id, result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  // A byte the vocabulary has no token for is dropped, as Hugging Face's BPE
  // does without an unknown token; its neighbours become adjacent.
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  for (char c : piece) {
    const TokenId id = byte_token_[static_cast<unsigned char>(c)];
    if (id >= 0) symbols.push_back({id, static_cast<int>(symbols.size()) - 1, -1});
  }
  const int n = static_cast<int>(symbols.size());
  for (int i = 0; i + 1 < n; ++i) symbols[static_cast<size_t>(i)].next = i + 1;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int left) {
    if (left < 0) return;
    const int right = symbols[static_cast<size_t>(left)].next;
    if (right < 0) return;
    const TokenId a = symbols[static_cast<size_t>(left)].id;
    const TokenId b = symbols[static_cast<size_t>(right)].id;
    auto it = merges_.find(PairKey(a, b));
    if (it != merges_.end()) heap.push({it->second.rank, left, a, b, it->second.result});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[static_cast<size_t>(c.left)];
    if (left.id != c.left_id || left.next < 0) continue;  // stale
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    if (right.id != c.right_id) continue;  // stale
    left.id = c.result;
    right.id = -1;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = c.left;
    consider(left.prev);
    consider(c.left);
  }
  for (int i = 0; i >= 0 && n > 0; i = symbols[static_cast<size_t>(i)].next) {
    out->push_back(symbols[static_cast<size_t>(i)].id);
  }
}

std::string BpeTokenizer::Decode(std::span<const TokenId> ids, bool skip_control) const {
  std::string out;
  for (TokenId id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_control && Kind(id) == TokenKind::kControl) continue;
    out += TokenBytes(id);
  }
  return out;
}

std::optional<TokenId> BpeTokenizer::Find(std::string_view token_text) const {
  auto it = vocab_.find(AbslView(token_text));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

}  // namespace tandem::tokenizer
