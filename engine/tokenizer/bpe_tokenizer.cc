#include "engine/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <queue>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "common/strings.h"
#include "engine/tokenizer/byte_map.h"
#include "engine/tokenizer/unicode.h"

namespace tandem::tokenizer {
namespace {

// U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's stand-in for a space.
constexpr std::string_view kSentencePieceSpace = "\xE2\x96\x81";

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
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  if (*model == "gpt2") {
    t->model_ = TokenizerModel::kByteLevelBpe;
  } else if (*model == "llama") {
    t->model_ = TokenizerModel::kSentencePiece;
  } else if (*model == "gemma4") {
    t->model_ = TokenizerModel::kSentencePieceMerges;
  } else if (*model == "bert") {
    t->model_ = TokenizerModel::kWordPiece;
  } else {
    return absl::UnimplementedError(StrCat(
        "tokenizer model '", *model,
        "' is not supported (supported: gpt2, i.e. byte-level BPE; llama, i.e. SentencePiece "
        "BPE; gemma4, i.e. ranked merges over SentencePiece text; bert, i.e. WordPiece)"));
  }

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
    if (token_kind == TokenKind::kControl || token_kind == TokenKind::kUserDefined) {
      t->token_bytes_[static_cast<size_t>(id)] = std::string(text);
      if (!text.empty()) {
        t->specials_by_length_.emplace_back(std::string(text), id);
        t->special_first_byte_[static_cast<unsigned char>(text[0])] = true;
      }
    }
    t->vocab_.emplace(std::string(text), id);  // first id wins for duplicate texts
  }
  std::stable_sort(t->specials_by_length_.begin(), t->specials_by_length_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  std::fill(std::begin(t->byte_token_), std::end(t->byte_token_), -1);

  if (absl::Status read = t->model_ == TokenizerModel::kByteLevelBpe
                              ? t->ReadByteLevelBpe(file, *tokens)
                              : t->ReadSentencePiece(file, *tokens);
      !read.ok()) {
    return read;
  }
  if (t->model_ == TokenizerModel::kByteLevelBpe ||
      t->model_ == TokenizerModel::kSentencePieceMerges) {
    if (absl::Status read = t->ReadMerges(file); !read.ok()) return read;
  }
  if (t->model_ == TokenizerModel::kWordPiece) {
    for (auto [key, field] :
         {std::pair{"tokenizer.ggml.normalizer.lowercase", &t->bert_normalizer_.lowercase},
          std::pair{"tokenizer.ggml.normalizer.strip_accents",
                    &t->bert_normalizer_.strip_accents}}) {
      if (!file.Has(key)) continue;
      absl::StatusOr<bool> value = file.GetBool(key);
      if (!value.ok()) return value.status();
      *field = *value;
    }
    for (const std::string_view token : *tokens) {
      t->longest_token_bytes_ = std::max(t->longest_token_bytes_, token.size());
    }
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
  // SentencePiece models begin every prompt with BOS unless the file says not to.
  bool add_bos = t->model_ == TokenizerModel::kSentencePiece;
  if (file.Has("tokenizer.ggml.add_bos_token")) {
    absl::StatusOr<bool> add = file.GetBool("tokenizer.ggml.add_bos_token");
    if (!add.ok()) return add.status();
    add_bos = *add;
  }
  t->add_bos_ = add_bos && t->special_.bos.has_value();
  return t;
}

absl::Status BpeTokenizer::ReadByteLevelBpe(const model::GgufFile& file,
                                            std::span<const std::string_view> tokens) {
  std::string_view pre_name = "default";
  if (file.Has("tokenizer.ggml.pre")) {
    absl::StatusOr<std::string_view> pre = file.GetString("tokenizer.ggml.pre");
    if (!pre.ok()) return pre.status();
    pre_name = *pre;
  }
  absl::StatusOr<PretokenizerKind> kind = PretokenizerFromGgufName(pre_name);
  if (!kind.ok()) return kind.status();
  pretokenizer_ = *kind;
  // Llama 3's tokenizer takes a piece that is a whole token as that token
  // before merging (Hugging Face's `ignore_merges`).
  ignore_merges_ = pretokenizer_ == PretokenizerKind::kLlama3;

  const std::array<char32_t, 256> byte_map = ByteToCodePoint();
  absl::flat_hash_map<char32_t, uint8_t> code_point_to_byte;
  for (int b = 0; b < 256; ++b)
    code_point_to_byte[byte_map[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
  for (size_t id = 0; id < tokens.size(); ++id) {
    const TokenKind kind_of = kinds_[id];
    if (kind_of == TokenKind::kControl || kind_of == TokenKind::kUserDefined) continue;
    const std::string_view text = tokens[id];
    std::string& bytes = token_bytes_[id];
    for (const CodePoint& cp : DecodeUtf8(text)) {
      auto it = code_point_to_byte.find(cp.value);
      if (it != code_point_to_byte.end()) {
        bytes.push_back(static_cast<char>(it->second));
      } else {
        bytes.append(text.substr(cp.offset, cp.length));  // not byte-level: keep as text
      }
    }
  }

  int byte_tokens = 0;
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    AppendUtf8(byte_map[static_cast<size_t>(b)], &symbol);
    auto it = vocab_.find(symbol);
    byte_token_[b] = it == vocab_.end() ? -1 : it->second;
    if (it != vocab_.end()) ++byte_tokens;
  }

  // Byte-level vocabularies cover (almost) every byte; some omit bytes never
  // seen in training (rare control characters, bytes invalid in UTF-8).
  if (byte_tokens < 128) {
    return absl::InvalidArgumentError(StrCat("the vocabulary has tokens for only ", byte_tokens,
                                             " of 256 bytes: not a byte-level BPE vocabulary"));
  }

  return absl::OkStatus();
}

absl::Status BpeTokenizer::ReadMerges(const model::GgufFile& file) {
  absl::StatusOr<std::vector<std::string_view>> merges =
      file.GetStringArray("tokenizer.ggml.merges");
  if (!merges.ok()) return merges.status();
  merges_.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const std::string_view merge = (*merges)[rank];
    const size_t space = merge.find(' ', 1);
    if (space == std::string_view::npos) {
      return absl::InvalidArgumentError(
          StrCat("merge #", rank, " ('", merge, "') is not two tokens separated by a space"));
    }
    const std::string left(merge.substr(0, space));
    const std::string right(merge.substr(space + 1));
    auto l = vocab_.find(left);
    auto r = vocab_.find(right);
    auto m = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || m == vocab_.end()) {
      return absl::InvalidArgumentError(
          StrCat("merge #", rank, " ('", merge, "') refers to a token not in the vocabulary"));
    }
    merges_.try_emplace(PairKey(l->second, r->second),
                        Merge{static_cast<int32_t>(rank), m->second});
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::ReadSentencePiece(const model::GgufFile& file,
                                             std::span<const std::string_view> tokens) {
  if (model_ == TokenizerModel::kSentencePiece) {
    absl::StatusOr<std::vector<float>> scores = file.GetFloatArray("tokenizer.ggml.scores");
    if (!scores.ok()) return scores.status();
    if (scores->size() != token_bytes_.size()) {
      return absl::InvalidArgumentError(StrCat("tokenizer.ggml.scores has ", scores->size(),
                                               " entries for ", token_bytes_.size(), " tokens"));
    }
    scores_ = *std::move(scores);
  }
  // WordPiece puts U+2581 before each word's first piece, which DecodeText
  // drops at the start as it drops SentencePiece's prefix.
  add_space_prefix_ =
      model_ == TokenizerModel::kSentencePiece || model_ == TokenizerModel::kWordPiece;
  if (file.Has("tokenizer.ggml.add_space_prefix")) {
    absl::StatusOr<bool> add = file.GetBool("tokenizer.ggml.add_space_prefix");
    if (!add.ok()) return add.status();
    add_space_prefix_ = *add;
  }
  for (size_t id = 0; id < tokens.size(); ++id) {
    const TokenKind kind_of = kinds_[id];
    if (kind_of == TokenKind::kControl || kind_of == TokenKind::kUserDefined) continue;
    const std::string_view text = tokens[id];
    std::string& bytes = token_bytes_[id];
    if (kind_of == TokenKind::kByte) {
      // <0xXX>
      unsigned value = 0;
      if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>' ||
          !absl::SimpleHexAtoi(AbslView(text.substr(3, 2)), &value)) {
        return absl::InvalidArgumentError(
            StrCat("byte token ", id, " ('", text, "') is not of the form <0xXX>"));
      }
      bytes.assign(1, static_cast<char>(value));
      if (byte_token_[value] < 0) byte_token_[value] = static_cast<TokenId>(id);
      continue;
    }
    bytes = absl::StrReplaceAll(AbslView(text), {{AbslView(kSentencePieceSpace), " "}});
  }
  return absl::OkStatus();
}

std::vector<TokenId> BpeTokenizer::Encode(std::string_view text, bool parse_special) const {
  if (specials_by_length_.empty()) {
    std::vector<TokenId> out;
    EncodePlain(text, &out);
    return out;
  }
  return EncodeSpecialWhere(text, [parse_special](size_t) { return parse_special; });
}

std::vector<TokenId> BpeTokenizer::EncodeSpecialWhere(
    std::string_view text, const std::function<bool(size_t)>& special_allowed) const {
  std::vector<TokenId> out;
  size_t plain_start = 0;
  size_t i = 0;
  while (i < text.size()) {
    const std::pair<std::string, TokenId>* match = nullptr;
    if (special_first_byte_[static_cast<unsigned char>(text[i])]) {
      std::optional<bool> allowed;  // special_allowed(i), asked once at most
      for (const auto& special : specials_by_length_) {
        if (text.compare(i, special.first.size(), special.first) != 0) continue;
        if (Kind(special.second) == TokenKind::kControl) {
          if (!allowed.has_value()) allowed = special_allowed(i);
          if (!*allowed) continue;
        }
        match = &special;
        break;
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
  if (model_ == TokenizerModel::kWordPiece) {
    EncodeWordPiece(text, out);
    return;
  }
  if (model_ != TokenizerModel::kByteLevelBpe) {
    // Every run of plain text starts the text or follows a special token,
    // which is where SentencePiece prefixes its space.
    std::string escaped = add_space_prefix_ ? std::string(kSentencePieceSpace) : std::string();
    escaped += absl::StrReplaceAll(AbslView(text), {{" ", AbslView(kSentencePieceSpace)}});
    if (model_ == TokenizerModel::kSentencePiece) {
      EncodeSentencePiece(escaped, out);
      return;
    }
    // Ranked merges run over runs of newlines and runs of other characters.
    const std::string_view view = escaped;
    size_t start = 0;
    while (start < view.size()) {
      const bool newlines = view[start] == '\n';
      size_t end = newlines ? view.find_first_not_of('\n', start) : view.find('\n', start);
      if (end == view.npos) end = view.size();
      EncodePiece(view.substr(start, end - start), out);
      start = end;
    }
    return;
  }
  for (std::string_view piece : Pretokenize(pretokenizer_, text)) EncodePiece(piece, out);
}

void BpeTokenizer::EncodeWordPiece(std::string_view text, std::vector<TokenId>* out) const {
  for (const std::string& word : BertWords(text, bert_normalizer_)) {
    const std::string pieces = StrCat(kSentencePieceSpace, word);
    const size_t first = out->size();
    for (size_t at = 0; at < pieces.size();) {
      // The longest token that starts here.
      size_t length = std::min(pieces.size() - at, longest_token_bytes_);
      for (; length > 0; --length) {
        auto it = vocab_.find(AbslView(std::string_view(pieces).substr(at, length)));
        if (it != vocab_.end()) {
          out->push_back(it->second);
          break;
        }
      }
      if (length == 0) {  // the word cannot be pieced together
        out->resize(first);
        break;
      }
      at += length;
    }
    if (out->size() == first && special_.unknown.has_value()) out->push_back(*special_.unknown);
  }
}

void BpeTokenizer::EncodeSentencePiece(std::string_view text, std::vector<TokenId>* out) const {
  // Symbols start as the text's characters and form a doubly linked list;
  // candidate merges of neighbours whose concatenation is a token sit in a
  // heap ordered by (score descending, position), and are checked when popped.
  struct Symbol {
    uint32_t offset, length;  // bytes of the text; length 0 once merged away
    int prev, next;
  };
  struct Candidate {
    float score;
    int left, right;
    uint32_t length;  // the merged symbol's bytes when pushed
    bool operator<(const Candidate& o) const {
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::vector<Symbol> symbols;
  for (const CodePoint& cp : DecodeUtf8(text)) {
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({cp.offset, cp.length, index - 1, index + 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  auto text_of = [&](uint32_t offset, uint32_t length) { return text.substr(offset, length); };
  std::priority_queue<Candidate> heap;
  auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    auto it = vocab_.find(AbslView(text_of(l.offset, l.length + r.length)));
    if (it == vocab_.end()) return;
    heap.push({scores_[static_cast<size_t>(it->second)], left, right, l.length + r.length});
  };
  for (size_t i = 1; i < symbols.size(); ++i) {
    consider(static_cast<int>(i) - 1, static_cast<int>(i));
  }
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[static_cast<size_t>(c.left)];
    Symbol& right = symbols[static_cast<size_t>(c.right)];
    if (left.length == 0 || right.length == 0 || left.length + right.length != c.length) {
      continue;  // stale: one side has merged since
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = c.left;
    consider(left.prev, c.left);
    consider(c.left, left.next);
  }
  // Every merged symbol is a token; a character the vocabulary lacks is
  // spelled in byte tokens, or becomes the unknown token without them.
  for (int i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& symbol = symbols[static_cast<size_t>(i)];
    const std::string_view piece = text_of(symbol.offset, symbol.length);
    if (auto it = vocab_.find(AbslView(piece)); it != vocab_.end()) {
      out->push_back(it->second);
      continue;
    }
    for (char byte : piece) {
      const TokenId id = byte_token_[static_cast<unsigned char>(byte)];
      if (id >= 0) {
        out->push_back(id);
      } else if (special_.unknown.has_value()) {
        out->push_back(*special_.unknown);
        break;
      }
    }
  }
}

void BpeTokenizer::EncodePiece(std::string_view piece, std::vector<TokenId>* out) const {
  // Symbols form a doubly linked list over the piece's bytes (byte-level) or
  // characters; candidate merges sit in a heap ordered by (rank, position)
  // and are checked when popped.
  struct Symbol {
    TokenId id;               // -1: a character without a token, never merged
    uint32_t offset, length;  // its bytes in the piece
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
  if (model_ == TokenizerModel::kByteLevelBpe ? ignore_merges_
                                              : piece.find_first_not_of('\n') == piece.npos) {
    // Llama 3 takes a piece that is a whole token as that token (Hugging
    // Face's `ignore_merges`); Gemma 4 does so for a run of newlines.
    static const std::array<char32_t, 256> kByteMap = ByteToCodePoint();
    std::string piece_text;
    if (model_ == TokenizerModel::kByteLevelBpe) {
      for (char c : piece) AppendUtf8(kByteMap[static_cast<unsigned char>(c)], &piece_text);
    } else {
      piece_text = std::string(piece);
    }
    if (auto it = vocab_.find(piece_text); it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  if (model_ == TokenizerModel::kByteLevelBpe) {
    // A byte the vocabulary has no token for is dropped, as Hugging Face's
    // BPE does without an unknown token; its neighbours become adjacent.
    for (uint32_t i = 0; i < piece.size(); ++i) {
      const TokenId id = byte_token_[static_cast<unsigned char>(piece[i])];
      if (id >= 0) symbols.push_back({id, i, 1, static_cast<int>(symbols.size()) - 1, -1});
    }
  } else {
    for (const CodePoint& cp : DecodeUtf8(piece)) {
      auto it = vocab_.find(AbslView(piece.substr(cp.offset, cp.length)));
      symbols.push_back({it == vocab_.end() ? -1 : it->second, cp.offset, cp.length,
                         static_cast<int>(symbols.size()) - 1, -1});
    }
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
    if (a < 0 || b < 0) return;
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
    const Symbol& symbol = symbols[static_cast<size_t>(i)];
    if (symbol.id >= 0) {
      out->push_back(symbol.id);
      continue;
    }
    // A character without a token, spelled in its byte tokens (<0xXX>).
    for (char byte : piece.substr(symbol.offset, symbol.length)) {
      if (const TokenId id = byte_token_[static_cast<unsigned char>(byte)]; id >= 0) {
        out->push_back(id);
      }
    }
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

std::string BpeTokenizer::DecodeText(std::span<const TokenId> ids) const {
  std::string out;
  bool run_start = true;  // the next plain token starts a run of plain text
  for (TokenId id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    const TokenKind kind = Kind(id);
    const bool special = kind == TokenKind::kControl || kind == TokenKind::kUserDefined;
    std::string_view bytes = TokenBytes(id);
    if (!special && run_start && add_space_prefix_ && !bytes.empty() && bytes[0] == ' ') {
      bytes.remove_prefix(1);
    }
    out += bytes;
    run_start = special;
  }
  return out;
}

std::optional<TokenId> BpeTokenizer::Find(std::string_view token_text) const {
  auto it = vocab_.find(AbslView(token_text));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

}  // namespace tandem::tokenizer
