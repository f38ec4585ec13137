// Attribute and item access, slicing, and the Python methods of str, dict,
// list and tuple, with ImmutableSandboxedEnvironment's rules: methods that
// mutate a list or dict are unsafe, and reading them gives an undefined value
// whose use is a SecurityError.
#include <algorithm>
#include <limits>

#include "common/strings.h"
#include "engine/tokenizer/jinja/builtins.h"
#include "engine/tokenizer/jinja/call_args.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/format.h"
#include "engine/tokenizer/jinja/text.h"

namespace tandem::jinja {
namespace {

using internal::Fail;
using U32 = std::u32string;

constexpr std::string_view kStrMethods[] = {
    "capitalize", "casefold",   "center",       "count",        "endswith",  "expandtabs",
    "find",       "format",     "index",        "isalnum",      "isalpha",   "isascii",
    "isdecimal",  "isdigit",    "isidentifier", "islower",      "isnumeric", "isprintable",
    "isspace",    "istitle",    "isupper",      "join",         "ljust",     "lower",
    "lstrip",     "partition",  "removeprefix", "removesuffix", "replace",   "rfind",
    "rindex",     "rjust",      "rpartition",   "rsplit",       "rstrip",    "split",
    "splitlines", "startswith", "strip",        "swapcase",     "title",     "upper",
    "zfill",      "encode",     "format_map",   "maketrans",    "translate"};
constexpr std::string_view kDictMethods[] = {"items", "keys", "values", "get", "copy", "fromkeys"};
constexpr std::string_view kDictUnsafe[] = {"clear", "pop", "popitem", "setdefault", "update"};
constexpr std::string_view kListMethods[] = {"index", "count", "copy"};
constexpr std::string_view kListUnsafe[] = {"append", "clear",  "extend",  "insert",
                                            "pop",    "remove", "reverse", "sort"};

template <size_t N>
bool In(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

bool HasMethod(const Value& obj, std::string_view name) {
  if (obj.is_string()) return In(kStrMethods, name);
  if (obj.is_dict()) return In(kDictMethods, name);
  if (obj.is_list()) return In(kListMethods, name);
  if (obj.is_tuple()) return name == "index" || name == "count";
  return false;
}

bool IsUnsafeMethod(const Value& obj, std::string_view name) {
  if (obj.is_dict()) return In(kDictUnsafe, name);
  if (obj.is_list()) return In(kListUnsafe, name);
  return false;
}

// jinja2's object_type_repr: "dict object", "None", ...
std::string ObjectTypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_object() && dynamic_cast<NamespaceObject*>(v.AsObject()) != nullptr) {
    return "jinja2.utils.Namespace object";
  }
  return TypeName(v) + " object";
}

Value NoAttribute(const Value& obj, std::string_view name) {
  return Value::Undefined(StrCat("'", ObjectTypeRepr(obj), "' has no attribute '", name, "'"));
}

Value Unsafe(const Value& obj, std::string_view name) {
  return Value::Undefined(
      StrCat("access to attribute '", name, "' of '", TypeName(obj), "' object is unsafe."), true);
}

// ---- str helpers over code points ----

Value MakeStr(std::string s, bool markup) {
  return markup ? Value::Markup(std::move(s)) : Value::String(std::move(s));
}

Value MakeStr32(const U32& s, bool markup) { return MakeStr(text::Encode(s), markup); }

const std::string& StrArg(std::string_view method, const Value& v) {
  if (!v.is_string()) {
    Fail(StrCat(method, "() argument must be str, not ", TypeName(v)));
  }
  return v.AsString();
}

// Python's slice-index normalisation of the optional start/end arguments.
void AdjustRange(const Params& p, size_t start_index, int64_t length, int64_t* start,
                 int64_t* end) {
  *start = 0;
  *end = length;
  auto adjust = [&](const Value* v, int64_t* out) {
    if (v == nullptr || v->is_none()) return;
    int64_t x = IntArg("slice", *v);
    if (x < 0) x = std::max<int64_t>(0, x + length);
    *out = std::min(x, length);
  };
  adjust(p.Get(start_index), start);
  if (p.Get(start_index + 1) != nullptr && !p.Get(start_index + 1)->is_none()) {
    int64_t x = IntArg("slice", *p.Get(start_index + 1));
    if (x < 0) x = std::max<int64_t>(0, x + length);
    *end = std::min(x, length);
  }
}

bool IsWs(char32_t c) { return text::IsSpace(c); }

U32 StripChars(const Value* chars, std::string_view method) {
  if (chars == nullptr || chars->is_none()) return U32();
  return text::Decode(StrArg(method, *chars));
}

U32 DoStrip(const U32& s, const Value* chars, bool left, bool right, std::string_view method) {
  U32 set = StripChars(chars, method);
  bool ws = chars == nullptr || chars->is_none();
  auto strip = [&](char32_t c) { return ws ? IsWs(c) : set.find(c) != U32::npos; };
  size_t b = 0;
  size_t e = s.size();
  if (left) {
    while (b < e && strip(s[b])) ++b;
  }
  if (right) {
    while (e > b && strip(s[e - 1])) --e;
  }
  return s.substr(b, e - b);
}

std::vector<U32> Split(const U32& s, const Value* sep_value, int64_t maxsplit) {
  std::vector<U32> out;
  if (sep_value == nullptr || sep_value->is_none()) {
    size_t i = 0;
    size_t n = s.size();
    int64_t splits = 0;
    while (true) {
      while (i < n && IsWs(s[i])) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && splits == maxsplit) {
        out.push_back(s.substr(i));
        break;
      }
      size_t j = i;
      while (j < n && !IsWs(s[j])) ++j;
      out.push_back(s.substr(i, j - i));
      ++splits;
      i = j;
    }
    return out;
  }
  U32 sep = text::Decode(StrArg("split", *sep_value));
  if (sep.empty()) Fail("empty separator");
  size_t i = 0;
  int64_t splits = 0;
  while (maxsplit < 0 || splits < maxsplit) {
    size_t j = s.find(sep, i);
    if (j == U32::npos) break;
    out.push_back(s.substr(i, j - i));
    i = j + sep.size();
    ++splits;
  }
  out.push_back(s.substr(i));
  return out;
}

std::vector<U32> RSplit(const U32& s, const Value* sep_value, int64_t maxsplit) {
  std::vector<U32> out;
  if (sep_value == nullptr || sep_value->is_none()) {
    int64_t i = static_cast<int64_t>(s.size()) - 1;
    int64_t splits = 0;
    while (i >= 0) {
      while (i >= 0 && IsWs(s[i])) --i;
      if (i < 0) break;
      if (maxsplit >= 0 && splits == maxsplit) {
        out.push_back(s.substr(0, i + 1));
        i = -1;
        break;
      }
      int64_t j = i;
      while (i >= 0 && !IsWs(s[i])) --i;
      out.push_back(s.substr(i + 1, j - i));
      ++splits;
    }
    std::reverse(out.begin(), out.end());
    return out;
  }
  U32 sep = text::Decode(StrArg("rsplit", *sep_value));
  if (sep.empty()) Fail("empty separator");
  size_t end = s.size();
  int64_t splits = 0;
  while (maxsplit < 0 || splits < maxsplit) {
    if (end < sep.size()) break;
    size_t j = s.rfind(sep, end - sep.size());
    if (j == U32::npos) break;
    out.push_back(s.substr(j + sep.size(), end - j - sep.size()));
    end = j;
    ++splits;
  }
  out.push_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

Value StrList(const std::vector<U32>& parts, bool markup) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (const U32& p : parts) items.push_back(MakeStr32(p, markup));
  return Value::List(std::move(items));
}

bool StartsOrEnds(const U32& s, const Value& affix, int64_t start, int64_t end, bool starts,
                  std::string_view method) {
  if (affix.is_tuple()) {
    for (const Value& v : affix.Items()) {
      if (StartsOrEnds(s, v, start, end, starts, method)) return true;
    }
    return false;
  }
  if (!affix.is_string()) {
    Fail(StrCat(method, " first arg must be str or a tuple of str, not ", TypeName(affix)));
  }
  U32 a = text::Decode(affix.AsString());
  if (start > end) return false;
  if (static_cast<int64_t>(a.size()) > end - start) return false;
  if (starts) return s.compare(start, a.size(), a) == 0;
  return s.compare(end - a.size(), a.size(), a) == 0;
}

int64_t Count(const U32& s, const U32& sub, int64_t start, int64_t end) {
  if (start > end) return 0;
  if (sub.empty()) return end - start + 1;
  int64_t n = 0;
  for (size_t i = start; i + sub.size() <= static_cast<size_t>(end);) {
    size_t j = s.find(sub, i);
    if (j == U32::npos || j + sub.size() > static_cast<size_t>(end)) break;
    ++n;
    i = j + sub.size();
  }
  return n;
}

Value Pad(const U32& s, const Params& p, std::string_view method, char how, bool markup) {
  int64_t width = IntArg(method, *p.Get(0));
  char32_t fill = ' ';
  if (const Value* f = p.Get(1)) {
    U32 fc = text::Decode(StrArg(method, *f));
    if (fc.size() != 1) Fail("The fill character must be exactly one character long");
    fill = fc[0];
  }
  auto len = static_cast<int64_t>(s.size());
  if (width <= len) return MakeStr32(s, markup);
  if (width > static_cast<int64_t>(internal::kMaxOutputBytes)) {
    internal::FailLimit("string too large");
  }
  int64_t marg = width - len;
  int64_t left = how == '<' ? 0 : how == '>' ? marg : marg / 2 + (marg & width & 1);
  U32 out(left, fill);
  out += s;
  out.append(marg - left, fill);
  return MakeStr32(out, markup);
}

Value StrMethod(const Value& self, std::string_view name, const CallArgs& args) {
  bool markup = self.is_markup();
  const std::string& raw = self.AsString();
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
      name == "swapcase" || name == "casefold") {
    NoArgs(name, args);
    if (name == "upper") return MakeStr(text::Upper(raw), markup);
    if (name == "lower" || name == "casefold") return MakeStr(text::Lower(raw), markup);
    if (name == "title") return MakeStr(text::Title(raw), markup);
    if (name == "capitalize") return MakeStr(text::Capitalize(raw), markup);
    return MakeStr(text::SwapCase(raw), markup);
  }
  U32 s = text::Decode(raw);
  auto len = static_cast<int64_t>(s.size());
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Params p(name, args, {"chars"});
    return MakeStr32(DoStrip(s, p.Get(0), name != "rstrip", name != "lstrip", name), markup);
  }
  if (name == "split" || name == "rsplit") {
    Params p(name, args, {"sep", "maxsplit"});
    int64_t maxsplit = p.Has(1) ? IntArg(name, *p.Get(1)) : -1;
    return StrList(name == "split" ? Split(s, p.Get(0), maxsplit) : RSplit(s, p.Get(0), maxsplit),
                   markup);
  }
  if (name == "splitlines") {
    Params p(name, args, {"keepends"});
    return StrList(text::SplitLines(s, p.Has(0) && Truthy(*p.Get(0))), markup);
  }
  if (name == "startswith" || name == "endswith") {
    Params p(name, args, {"prefix", "start", "end"}, 1);
    int64_t start;
    int64_t end;
    // Unlike find(), a start past the end still compares (an empty affix).
    start = 0;
    end = len;
    if (const Value* v = p.Get(1); v != nullptr && !v->is_none()) {
      start = IntArg(name, *v);
      if (start < 0) start = std::max<int64_t>(0, start + len);
    }
    if (const Value* v = p.Get(2); v != nullptr && !v->is_none()) {
      end = IntArg(name, *v);
      if (end < 0) end = std::max<int64_t>(0, end + len);
      end = std::min(end, len);
    }
    if (start > len) return Value::Bool(false);
    return Value::Bool(StartsOrEnds(s, *p.Get(0), start, end, name == "startswith", name));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    Params p(name, args, {"sub", "start", "end"}, 1);
    U32 sub = text::Decode(StrArg(name, *p.Get(0)));
    int64_t start;
    int64_t end;
    AdjustRange(p, 1, len, &start, &end);
    if (name == "count") return Value::Int(Count(s, sub, start, end));
    int64_t found = -1;
    if (start <= end && static_cast<int64_t>(sub.size()) <= end - start) {
      if (name == "find" || name == "index") {
        size_t j = s.find(sub, start);
        if (j != U32::npos && static_cast<int64_t>(j + sub.size()) <= end) found = j;
      } else {
        size_t j = s.rfind(sub, end - sub.size());
        if (j != U32::npos && static_cast<int64_t>(j) >= start) found = j;
      }
    }
    if (found < 0 && (name == "index" || name == "rindex")) Fail("substring not found");
    return Value::Int(found);
  }
  if (name == "replace") {
    Params p(name, args, {"old", "new", "count"}, 2);
    U32 old_s = text::Decode(StrArg(name, *p.Get(0)));
    const Value& new_v = *p.Get(1);
    std::string new_text = StrArg(name, new_v);
    if (markup && !new_v.is_markup()) new_text = text::HtmlEscape(new_text);
    U32 new_s = text::Decode(new_text);
    int64_t count = p.Has(2) ? IntArg(name, *p.Get(2)) : -1;
    U32 out;
    if (old_s.empty()) {
      int64_t done = 0;
      for (size_t i = 0; i <= s.size(); ++i) {
        if (count < 0 || done < count) {
          out += new_s;
          ++done;
        }
        if (i < s.size()) out.push_back(s[i]);
      }
    } else {
      size_t i = 0;
      int64_t done = 0;
      while (count < 0 || done < count) {
        size_t j = s.find(old_s, i);
        if (j == U32::npos) break;
        out.append(s, i, j - i);
        out += new_s;
        i = j + old_s.size();
        ++done;
        if (out.size() > internal::kMaxOutputBytes) internal::FailLimit("string too large");
      }
      out.append(s, i, U32::npos);
    }
    return MakeStr32(out, markup);
  }
  if (name == "join") {
    Params p(name, args, {"iterable"}, 1);
    std::vector<Value> items = Iterate(*p.Get(0));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        Fail(
            StrCat("sequence item ", i, ": expected str instance, ", TypeName(items[i]), " found"));
      }
      if (i > 0) out += raw;
      out += markup && !items[i].is_markup() ? text::HtmlEscape(items[i].AsString())
                                             : items[i].AsString();
      if (out.size() > internal::kMaxOutputBytes) internal::FailLimit("string too large");
    }
    return MakeStr(std::move(out), markup);
  }
  if (name == "format") return MakeStr(StrFormat(raw, args, markup), markup);
  if (name == "format_map") {
    Params p(name, args, {"mapping"}, 1);
    if (!p.Get(0)->is_dict()) Fail("format_map() argument must be a mapping");
    CallArgs kw;
    for (const auto& [k, v] : p.Get(0)->AsDict().entries()) kw.kwargs.emplace_back(Str(k), v);
    return MakeStr(StrFormat(raw, kw, markup), markup);
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    Params p(name, args, {"width", "fillchar"}, 1);
    return Pad(s, p, name, name == "center" ? '^' : name == "ljust" ? '<' : '>', markup);
  }
  if (name == "zfill") {
    Params p(name, args, {"width"}, 1);
    int64_t width = IntArg(name, *p.Get(0));
    if (width <= len) return MakeStr32(s, markup);
    if (width > static_cast<int64_t>(internal::kMaxOutputBytes)) {
      internal::FailLimit("string too large");
    }
    size_t at = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
    U32 out = s;
    out.insert(at, U32(width - len, '0'));
    return MakeStr32(out, markup);
  }
  if (name == "partition" || name == "rpartition") {
    Params p(name, args, {"sep"}, 1);
    U32 sep = text::Decode(StrArg(name, *p.Get(0)));
    if (sep.empty()) Fail("empty separator");
    size_t j = name == "partition" ? s.find(sep) : s.rfind(sep);
    std::vector<U32> parts;
    if (j == U32::npos) {
      parts = name == "partition" ? std::vector<U32>{s, U32(), U32()}
                                  : std::vector<U32>{U32(), U32(), s};
    } else {
      parts = {s.substr(0, j), sep, s.substr(j + sep.size())};
    }
    std::vector<Value> items;
    for (const U32& part : parts) items.push_back(MakeStr32(part, markup));
    return Value::Tuple(std::move(items));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    Params p(name, args, {"affix"}, 1);
    U32 a = text::Decode(StrArg(name, *p.Get(0)));
    if (name == "removeprefix" && s.compare(0, a.size(), a) == 0) {
      return MakeStr32(s.substr(a.size()), markup);
    }
    if (name == "removesuffix" && !a.empty() && s.size() >= a.size() &&
        s.compare(s.size() - a.size(), a.size(), a) == 0) {
      return MakeStr32(s.substr(0, s.size() - a.size()), markup);
    }
    return MakeStr32(s, markup);
  }
  if (name == "expandtabs") {
    Params p(name, args, {"tabsize"});
    int64_t tab = p.Has(0) ? IntArg(name, *p.Get(0)) : 8;
    if (tab > static_cast<int64_t>(internal::kMaxOutputBytes)) {
      internal::FailLimit("string too large");
    }
    U32 out;
    int64_t col = 0;
    for (char32_t c : s) {
      if (c == '\t') {
        if (tab > 0) {
          int64_t n = tab - col % tab;
          out.append(n, ' ');
          col += n;
        }
      } else {
        out.push_back(c);
        col = (c == '\n' || c == '\r') ? 0 : col + 1;
      }
      if (out.size() > internal::kMaxOutputBytes) internal::FailLimit("string too large");
    }
    return MakeStr32(out, markup);
  }
  // The is*() predicates.
  NoArgs(name, args);
  auto all = [&](auto pred) {
    if (s.empty()) return false;
    for (char32_t c : s) {
      if (!pred(c)) return false;
    }
    return true;
  };
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") {
    return Value::Bool(all(text::IsDecimal));
  }
  if (name == "isalpha") return Value::Bool(all(text::IsAlpha));
  if (name == "isalnum") return Value::Bool(all(text::IsAlnum));
  if (name == "isspace") return Value::Bool(all(text::IsSpace));
  if (name == "isascii") {
    for (char32_t c : s) {
      if (c >= 0x80) return Value::Bool(false);
    }
    return Value::Bool(true);
  }
  if (name == "isprintable") {
    for (char32_t c : s) {
      if (!text::IsPrintable(c)) return Value::Bool(false);
    }
    return Value::Bool(true);
  }
  if (name == "isidentifier") {
    if (s.empty() || text::IsDecimal(s[0])) return Value::Bool(false);
    return Value::Bool(all([](char32_t c) { return text::IsWordChar(c); }));
  }
  if (name == "islower" || name == "isupper") {
    bool cased = false;
    for (char32_t c : s) {
      if (name == "islower" ? text::IsUpper(c) : text::IsLower(c)) return Value::Bool(false);
      cased |= text::IsUpper(c) || text::IsLower(c);
    }
    return Value::Bool(cased);
  }
  if (name == "istitle") {
    bool cased = false;
    bool previous_cased = false;
    for (char32_t c : s) {
      if (text::IsUpper(c)) {
        if (previous_cased) return Value::Bool(false);
        previous_cased = cased = true;
      } else if (text::IsLower(c)) {
        if (!previous_cased) return Value::Bool(false);
        previous_cased = cased = true;
      } else {
        previous_cased = false;
      }
    }
    return Value::Bool(cased);
  }
  Fail(StrCat("str.", name, "() is not supported"));
}

Value DictMethod(const Value& self, std::string_view name, const CallArgs& args) {
  const DictObject& d = self.AsDict();
  if (name == "items" || name == "keys" || name == "values") {
    NoArgs(name, args);
    std::vector<Value> out;
    out.reserve(d.size());
    for (const auto& [k, v] : d.entries()) {
      if (name == "items") {
        out.push_back(Value::Tuple({k, v}));
      } else {
        out.push_back(name == "keys" ? k : v);
      }
    }
    return Value::List(std::move(out));
  }
  if (name == "get") {
    Params p("get", args, {"key", "default"}, 1);
    const Value& key = *p.Get(0);
    if (key.is_list() || key.is_dict()) Fail(StrCat("unhashable type: '", TypeName(key), "'"));
    const Value* v = d.Find(key);
    return v != nullptr ? *v : p.Or(1, Value::None());
  }
  if (name == "copy") {
    NoArgs(name, args);
    auto copy = std::make_shared<DictObject>();
    for (const auto& [k, v] : d.entries()) copy->Set(k, v);
    return Value::Dict(std::move(copy));
  }
  Fail(StrCat("dict.", name, "() is not supported"));
}

Value SequenceMethod(const Value& self, std::string_view name, const CallArgs& args) {
  const auto& items = self.Items();
  if (name == "count") {
    Params p("count", args, {"value"}, 1);
    int64_t n = 0;
    for (const Value& v : items) n += Equals(v, *p.Get(0));
    return Value::Int(n);
  }
  if (name == "index") {
    Params p("index", args, {"value", "start", "stop"}, 1);
    int64_t start;
    int64_t end;
    AdjustRange(p, 1, static_cast<int64_t>(items.size()), &start, &end);
    for (int64_t i = start; i < end; ++i) {
      if (Equals(items[i], *p.Get(0))) return Value::Int(i);
    }
    Fail(StrCat(Repr(*p.Get(0)), " is not in ", TypeName(self)));
  }
  if (name == "copy") {
    NoArgs(name, args);
    return Value::List(items);
  }
  Fail(StrCat(TypeName(self), ".", name, "() is not supported"));
}

Value CallBuiltinMethod(const Value& obj, std::string_view name, const CallArgs& args) {
  if (obj.is_string()) return StrMethod(obj, name, args);
  if (obj.is_dict()) return DictMethod(obj, name, args);
  return SequenceMethod(obj, name, args);
}

// Python's slice.indices(): the indices a slice selects from a sequence of
// `length` items.
std::vector<int64_t> SliceIndices(int64_t length, const Value* start_v, const Value* stop_v,
                                  const Value* step_v) {
  auto get = [](const Value* v, bool* given) -> int64_t {
    *given = v != nullptr && !v->is_none();
    if (!*given) return 0;
    if (!v->is_integral()) {
      Fail("slice indices must be integers or None or have an __index__ method");
    }
    return v->AsInt();
  };
  bool has_start;
  bool has_stop;
  bool has_step;
  int64_t start = get(start_v, &has_start);
  int64_t stop = get(stop_v, &has_stop);
  int64_t step = get(step_v, &has_step);
  if (!has_step) step = 1;
  if (step == 0) Fail("slice step cannot be zero");
  auto clamp = [&](int64_t x, bool given, int64_t def) -> int64_t {
    if (!given) return def;
    if (x < 0) {
      x += length;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= length) {
      x = step < 0 ? length - 1 : length;
    }
    return x;
  };
  start = clamp(start, has_start, step < 0 ? length - 1 : 0);
  stop = clamp(stop, has_stop, step < 0 ? -1 : length);
  std::vector<int64_t> out;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) out.push_back(i);
  } else {
    for (int64_t i = start; i > stop; i += step) out.push_back(i);
  }
  return out;
}

}  // namespace

Value GetAttr(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (HasMethod(obj, name)) {
    std::string method(name);
    return MakeFunction(StrCat("<built-in method ", name, " of ", TypeName(obj), " object>"),
                        [obj, method](Interpreter&, CallArgs& args) {
                          return CallBuiltinMethod(obj, method, args);
                        });
  }
  if (IsUnsafeMethod(obj, name)) return Unsafe(obj, name);
  if (obj.is_number() && (name == "real" || name == "imag")) {
    if (obj.is_float()) return Value::Float(name == "real" ? obj.AsFloat() : 0.0);
    return Value::Int(name == "real" ? obj.AsInt() : 0);
  }
  if (obj.is_dict()) {
    if (const Value* v = obj.AsDict().Find(name)) return *v;
  } else if (obj.is_object()) {
    Value out;
    if (obj.AsObject()->GetAttr(name, &out)) return out;
  }
  return NoAttribute(obj, name);
}

Value GetAttrOnly(const Value& obj, std::string_view name) {
  if (HasMethod(obj, name) || IsUnsafeMethod(obj, name) ||
      (obj.is_number() && (name == "real" || name == "imag"))) {
    return GetAttr(obj, name);
  }
  if (obj.is_object()) {
    Value out;
    if (obj.AsObject()->GetAttr(name, &out)) return out;
  }
  return NoAttribute(obj, name);
}

Value GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) FailUndefined(obj);
  switch (obj.kind()) {
    case Kind::kDict:
      if (!key.is_list() && !key.is_dict()) {
        if (const Value* v = obj.AsDict().Find(key)) return *v;
      }
      break;
    case Kind::kList:
    case Kind::kTuple:
      if (key.is_integral()) {
        int64_t i = key.AsInt();
        auto n = static_cast<int64_t>(obj.Items().size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return obj.Items()[i];
      }
      break;
    case Kind::kString:
      if (key.is_integral()) {
        int64_t i = key.AsInt();
        const std::string& s = obj.AsString();
        if (text::IsAscii(s)) {
          auto n = static_cast<int64_t>(s.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value::String(std::string(1, s[i]));
        } else {
          U32 cps = text::Decode(s);
          auto n = static_cast<int64_t>(cps.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value::String(text::Encode(cps.substr(i, 1)));
        }
      }
      break;
    default:
      break;
  }
  if (key.is_string()) {
    std::string_view name = key.AsString();
    if (HasMethod(obj, name) || IsUnsafeMethod(obj, name)) return GetAttr(obj, name);
    if (obj.is_object()) {
      Value out;
      if (obj.AsObject()->GetAttr(name, &out)) return out;
    }
    return NoAttribute(obj, name);
  }
  return Value::Undefined(StrCat(ObjectTypeRepr(obj), " has no element ", Repr(key)));
}

Value Slice(const Value& obj, const Value* start, const Value* stop, const Value* step) {
  if (obj.is_undefined()) FailUndefined(obj);
  if (obj.is_string()) {
    const std::string& s = obj.AsString();
    bool ascii = text::IsAscii(s);
    U32 cps = ascii ? U32() : text::Decode(s);
    auto n = static_cast<int64_t>(ascii ? s.size() : cps.size());
    std::vector<int64_t> idx = SliceIndices(n, start, stop, step);
    std::string out;
    if (ascii) {
      out.reserve(idx.size());
      for (int64_t i : idx) out.push_back(s[i]);
    } else {
      for (int64_t i : idx) text::AppendUtf8(cps[i], &out);
    }
    return Value::String(std::move(out));
  }
  if (obj.is_sequence()) {
    const auto& items = obj.Items();
    std::vector<int64_t> idx = SliceIndices(static_cast<int64_t>(items.size()), start, stop, step);
    std::vector<Value> out;
    out.reserve(idx.size());
    for (int64_t i : idx) out.push_back(items[i]);
    return obj.is_tuple() ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
  }
  return Value::Undefined(StrCat(ObjectTypeRepr(obj), " has no element slice"));
}

bool CallMethod(Interpreter&, const Value& obj, std::string_view name, CallArgs& args,
                Value* result) {
  if (!HasMethod(obj, name)) return false;
  *result = CallBuiltinMethod(obj, name, args);
  return true;
}

}  // namespace tandem::jinja
