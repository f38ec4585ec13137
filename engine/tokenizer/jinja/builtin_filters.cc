// jinja2's filters (jinja2/filters.py, 3.1), and transformers' tojson.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/strings.h"
#include "engine/tokenizer/jinja/builtins.h"
#include "engine/tokenizer/jinja/call_args.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/format.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/text.h"

namespace tandem::jinja {
namespace {

using internal::Fail;
using FilterFn = Value (*)(Interpreter&, Value, CallArgs&);

// soft_str: strings (and Markup) as they are, anything else through str().
Value SoftStr(const Value& v) { return v.is_string() ? v : Value::String(Str(v)); }

Value KeepMarkup(const Value& like, std::string s) {
  return like.is_markup() ? Value::Markup(std::move(s)) : Value::String(std::move(s));
}

Value IgnoreCase(const Value& v) {
  return v.is_string() ? Value::String(text::Lower(v.AsString())) : v;
}

// make_attrgetter: "a.b.0" looks up item a, then b, then 0.
Value GetPath(const Value& item, const Value& attribute) {
  if (attribute.is_none()) return item;
  Value v = item;
  if (attribute.is_string()) {
    std::string_view path = attribute.AsString();
    size_t start = 0;
    while (true) {
      size_t dot = path.find('.', start);
      std::string_view part = path.substr(start, dot - start);
      Value key = !part.empty() && part.find_first_not_of("0123456789") == std::string_view::npos
                      ? Value::Int(std::strtoll(std::string(part).c_str(), nullptr, 10))
                      : Value::String(std::string(part));
      v = GetItem(v, key);
      if (dot == std::string_view::npos) break;
      start = dot + 1;
    }
    return v;
  }
  return GetItem(v, attribute);
}

std::vector<Value> Items(const Value& v) {
  if (v.is_none() || v.is_number() ||
      (v.is_object() && v.AsObject()->TypeName() != "LoopContext")) {
    Fail(StrCat("'", TypeName(v), "' object is not iterable"));
  }
  return Iterate(v);
}

// `for item in value`, one item at a time, starting at the first call (a
// generator's body runs only when it is iterated).
class ItemSource {
 public:
  explicit ItemSource(Value v) : value_(std::move(v)) {}
  bool Next(Value* out) {
    if (!started_) {
      started_ = true;
      if (!value_.is_iterator()) items_ = Items(value_);
    }
    if (value_.is_iterator()) return value_.AsIterator().Next(out);
    if (pos_ >= items_.size()) return false;
    *out = items_[pos_++];
    return true;
  }

 private:
  Value value_;
  bool started_ = false;
  std::vector<Value> items_;
  size_t pos_ = 0;
};

// ---- strings ----

Value Trim(Interpreter& in, Value v, CallArgs& args) {
  Params p("trim", args, {"chars"});
  Value s = SoftStr(v);
  CallArgs strip_args;
  if (p.Has(0)) strip_args.args.push_back(*p.Get(0));
  Value out;
  CallMethod(in, s, "strip", strip_args, &out);
  return out;
}

Value Upper(Interpreter&, Value v, CallArgs& args) {
  NoArgs("upper", args);
  Value s = SoftStr(v);
  return KeepMarkup(s, text::Upper(s.AsString()));
}

Value Lower(Interpreter&, Value v, CallArgs& args) {
  NoArgs("lower", args);
  Value s = SoftStr(v);
  return KeepMarkup(s, text::Lower(s.AsString()));
}

Value Capitalize(Interpreter&, Value v, CallArgs& args) {
  NoArgs("capitalize", args);
  Value s = SoftStr(v);
  return KeepMarkup(s, text::Capitalize(s.AsString()));
}

Value Title(Interpreter&, Value v, CallArgs& args) {
  NoArgs("title", args);
  Value s = SoftStr(v);
  // Each run between the delimiters [-\s({[<] gets an upper first character
  // and a lower rest.
  std::u32string cps = text::Decode(s.AsString());
  auto delimiter = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || text::IsSpace(c);
  };
  std::string out;
  bool word_start = true;
  for (char32_t c : cps) {
    std::string one;
    text::AppendUtf8(c, &one);
    if (delimiter(c)) {
      out += one;
      word_start = true;
    } else if (word_start) {
      out += text::Upper(one);
      word_start = false;
    } else {
      out += text::Lower(one);
    }
  }
  return KeepMarkup(s, std::move(out));
}

Value Replace(Interpreter& in, Value v, CallArgs& args) {
  Params p("replace", args, {"old", "new", "count"}, 2);
  CallArgs replace_args;
  replace_args.args = {Value::String(Str(*p.Get(0))), Value::String(Str(*p.Get(1)))};
  if (p.Has(2) && !p.Get(2)->is_none()) replace_args.args.push_back(*p.Get(2));
  Value out;
  CallMethod(in, Value::String(Str(v)), "replace", replace_args, &out);
  return out;
}

Value String(Interpreter&, Value v, CallArgs& args) {
  NoArgs("string", args);
  return SoftStr(v);
}

Value Safe(Interpreter&, Value v, CallArgs& args) {
  NoArgs("safe", args);
  return Value::Markup(Str(v));
}

Value Escape(Interpreter&, Value v, CallArgs& args) {
  NoArgs("escape", args);
  if (v.is_markup()) return v;
  return Value::Markup(text::HtmlEscape(Str(v)));
}

Value ForceEscape(Interpreter&, Value v, CallArgs& args) {
  NoArgs("forceescape", args);
  return Value::Markup(text::HtmlEscape(Str(v)));
}

Value Center(Interpreter& in, Value v, CallArgs& args) {
  Params p("center", args, {"width"});
  CallArgs center_args;
  center_args.args.push_back(p.Or(0, Value::Int(80)));
  Value out;
  CallMethod(in, SoftStr(v), "center", center_args, &out);
  return out;
}

Value Indent(Interpreter&, Value v, CallArgs& args) {
  Params p("indent", args, {"width", "first", "blank"});
  if (v.is_undefined()) FailUndefined(v);
  if (!v.is_string())
    Fail(StrCat("unsupported operand type(s) for +=: '", TypeName(v), "' and 'str'"));
  Value width = p.Or(0, Value::Int(4));
  int64_t spaces = width.is_string() ? 0 : IntArg("indent", width);
  if (spaces > static_cast<int64_t>(internal::kMaxOutputBytes))
    internal::FailLimit("string too large");
  std::string indention =
      width.is_string() ? width.AsString() : std::string(std::max<int64_t>(0, spaces), ' ');
  if (indention.size() > internal::kMaxOutputBytes) internal::FailLimit("string too large");
  bool first = p.Has(1) && Truthy(*p.Get(1));
  bool blank = p.Has(2) && Truthy(*p.Get(2));
  std::vector<std::u32string> lines = text::SplitLines(text::Decode(v.AsString() + "\n"), false);
  std::string out;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) absl::StrAppend(&out, "\n", indention);
      out += text::Encode(lines[i]);
    }
  } else {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) {
        out += "\n";
        if (!lines[i].empty()) out += indention;
      }
      out += text::Encode(lines[i]);
      if (out.size() > internal::kMaxOutputBytes) internal::FailLimit("string too large");
    }
  }
  if (first) out = indention + out;
  return KeepMarkup(v, std::move(out));
}

Value Truncate(Interpreter&, Value v, CallArgs& args) {
  Params p("truncate", args, {"length", "killwords", "end", "leeway"});
  int64_t length = p.Has(0) ? IntArg("truncate", *p.Get(0)) : 255;
  bool killwords = p.Has(1) && Truthy(*p.Get(1));
  std::string end = p.Has(2) ? Str(*p.Get(2)) : "...";
  int64_t leeway = p.Has(3) && !p.Get(3)->is_none() ? IntArg("truncate", *p.Get(3)) : 5;
  auto end_len = static_cast<int64_t>(text::Length(end));
  if (length < end_len) Fail(StrCat("expected length >= ", end_len, ", got ", length));
  if (leeway < 0) Fail(StrCat("expected leeway >= 0, got ", leeway));
  if (Length(v) <= length + leeway) return v;
  if (!v.is_string()) Fail(StrCat("'", TypeName(v), "' object has no attribute 'rsplit'"));
  std::u32string s = text::Decode(v.AsString());
  std::u32string head = s.substr(0, length - end_len);
  if (killwords) return Value::String(text::Encode(head) + end);
  size_t space = head.rfind(U' ');
  if (space != std::u32string::npos) head = head.substr(0, space);
  return Value::String(text::Encode(head) + end);
}

Value WordCount(Interpreter&, Value v, CallArgs& args) {
  NoArgs("wordcount", args);
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : text::Decode(Str(v))) {
    bool w = text::IsWordChar(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::Int(n);
}

Value Format(Interpreter&, Value v, CallArgs& args) {
  if (!args.args.empty() && !args.kwargs.empty()) {
    Fail("can't handle positional and keyword arguments at the same time");
  }
  Value values;
  if (!args.kwargs.empty()) {
    auto d = std::make_shared<DictObject>();
    for (const auto& [k, x] : args.kwargs) d->Set(Value::String(k), x);
    values = Value::Dict(std::move(d));
  } else {
    values = Value::Tuple(args.args);
  }
  return PercentFormat(SoftStr(v), values);
}

Value StripTags(Interpreter&, Value v, CallArgs& args) {
  NoArgs("striptags", args);
  std::string s = Str(v);
  std::string no_tags;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 4, "<!--") == 0) {
      size_t end = s.find("-->", i + 4);
      if (end == std::string::npos) {
        no_tags += s.substr(i);
        break;
      }
      i = end + 3;
    } else if (s[i] == '<') {
      size_t end = s.find('>', i + 1);
      if (end == std::string::npos) {
        no_tags += s.substr(i);
        break;
      }
      i = end + 1;
    } else {
      no_tags.push_back(s[i++]);
    }
  }
  // Collapse whitespace, then unescape entities.
  std::string collapsed;
  bool space = false;
  for (char32_t c : text::Decode(no_tags)) {
    if (text::IsSpace(c)) {
      space = true;
      continue;
    }
    if (space && !collapsed.empty()) collapsed.push_back(' ');
    space = false;
    text::AppendUtf8(c, &collapsed);
  }
  static constexpr std::pair<std::string_view, std::string_view> kEntities[] = {
      {"&amp;", "&"}, {"&lt;", "<"},   {"&gt;", ">"},
      {"&#39;", "'"}, {"&#34;", "\""}, {"&quot;", "\""}};
  std::string out;
  for (size_t i = 0; i < collapsed.size();) {
    bool matched = false;
    for (const auto& [entity, ch] : kEntities) {
      if (collapsed.compare(i, entity.size(), entity) == 0) {
        out += ch;
        i += entity.size();
        matched = true;
        break;
      }
    }
    if (!matched) out.push_back(collapsed[i++]);
  }
  return Value::String(std::move(out));
}

std::string UrlQuote(const std::string& s, bool for_qs) {
  std::string out;
  char buf[4];
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
        c == '.' || c == '-' || c == '~' || (c == '/' && !for_qs)) {
      out.push_back(ch);
    } else if (c == ' ' && for_qs) {
      out.push_back('+');
    } else {
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

Value UrlEncode(Interpreter&, Value v, CallArgs& args) {
  NoArgs("urlencode", args);
  if (v.is_string()) return Value::String(UrlQuote(v.AsString(), false));
  std::vector<std::pair<Value, Value>> pairs;
  if (v.is_dict()) {
    pairs = v.AsDict().entries();
  } else {
    for (const Value& item : Items(v)) {
      std::vector<Value> kv = Iterate(item);
      if (kv.size() != 2) Fail("too many values to unpack (expected 2)");
      pairs.emplace_back(kv[0], kv[1]);
    }
  }
  std::string out;
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (i > 0) out += "&";
    out += StrCat(UrlQuote(Str(pairs[i].first), true), "=", UrlQuote(Str(pairs[i].second), true));
  }
  return Value::String(std::move(out));
}

Value XmlAttr(Interpreter&, Value v, CallArgs& args) {
  Params p("xmlattr", args, {"autospace"});
  bool autospace = !p.Has(0) || Truthy(*p.Get(0));
  if (!v.is_dict()) Fail(StrCat("'", TypeName(v), "' object has no attribute 'items'"));
  std::string out;
  for (const auto& [k, x] : v.AsDict().entries()) {
    if (x.is_none() || x.is_undefined()) continue;
    std::string key = Str(k);
    if (key.find_first_of(" \t\n\r\f\v/>=") != std::string::npos) {
      Fail(StrCat("Invalid character in attribute name: ", text::ReprString(key)));
    }
    if (!out.empty()) out += " ";
    absl::StrAppend(&out, text::HtmlEscape(key), "=\"",
                    x.is_markup() ? x.AsString() : text::HtmlEscape(Str(x)), "\"");
  }
  if (autospace && !out.empty()) out.insert(out.begin(), ' ');
  return Value::Markup(std::move(out));
}

Value FileSizeFormat(Interpreter&, Value v, CallArgs& args) {
  Params p("filesizeformat", args, {"binary"});
  bool binary = p.Has(0) && Truthy(*p.Get(0));
  if (!v.is_number() && !v.is_string()) Fail("float() argument must be a string or a real number");
  double bytes = v.is_string() ? std::strtod(v.AsString().c_str(), nullptr) : v.AsFloat();
  double base = binary ? 1024 : 1000;
  static constexpr const char* kBinary[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  static constexpr const char* kDecimal[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  if (bytes == 1) return Value::String("1 Byte");
  if (bytes < base) return Value::String(StrCat(static_cast<int64_t>(bytes), " Bytes"));
  double unit = base;
  const char* prefix = "";
  for (int i = 0; i < 8; ++i) {
    unit = std::pow(base, i + 2);
    prefix = binary ? kBinary[i] : kDecimal[i];
    if (bytes < unit) break;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f %s", base * bytes / unit, prefix);
  return Value::String(buf);
}

// ---- numbers ----

// Python's float(str).
bool ParseFloat(const std::string& s, double* out) {
  std::string t;
  std::u32string cps = text::Decode(s);
  size_t b = 0;
  size_t e = cps.size();
  while (b < e && text::IsSpace(cps[b])) ++b;
  while (e > b && text::IsSpace(cps[e - 1])) --e;
  std::string body = text::Encode(cps.substr(b, e - b));
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '_') {
      bool ok = i > 0 && i + 1 < body.size() &&
                std::isdigit(static_cast<unsigned char>(body[i - 1])) &&
                std::isdigit(static_cast<unsigned char>(body[i + 1]));
      if (!ok) return false;
      continue;
    }
    t.push_back(body[i]);
  }
  if (t.empty()) return false;
  std::string lower = text::Lower(t);
  std::string unsigned_part = lower[0] == '+' || lower[0] == '-' ? lower.substr(1) : lower;
  if (unsigned_part == "inf" || unsigned_part == "infinity" || unsigned_part == "nan") {
    double v = unsigned_part == "nan" ? NAN : INFINITY;
    *out = lower[0] == '-' ? -v : v;
    return true;
  }
  if (unsigned_part.find_first_not_of("0123456789.e+-") != std::string::npos) return false;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return false;
  *out = v;
  return true;
}

// Python's int(str, base).
bool ParseInt(const std::string& s, int base, int64_t* out) {
  std::u32string cps = text::Decode(s);
  size_t b = 0;
  size_t e = cps.size();
  while (b < e && text::IsSpace(cps[b])) ++b;
  while (e > b && text::IsSpace(cps[e - 1])) --e;
  std::string t = text::Encode(cps.substr(b, e - b));
  bool negative = false;
  size_t i = 0;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) negative = t[i++] == '-';
  std::string lower = text::Lower(t.substr(i));
  if (base == 16 && lower.rfind("0x", 0) == 0) lower = lower.substr(2);
  if (base == 8 && lower.rfind("0o", 0) == 0) lower = lower.substr(2);
  if (base == 2 && lower.rfind("0b", 0) == 0) lower = lower.substr(2);
  if (base == 0) {
    base = 10;
    if (lower.rfind("0x", 0) == 0)
      base = 16, lower = lower.substr(2);
    else if (lower.rfind("0o", 0) == 0)
      base = 8, lower = lower.substr(2);
    else if (lower.rfind("0b", 0) == 0)
      base = 2, lower = lower.substr(2);
  }
  if (base < 2 || base > 36) return false;
  if (lower.empty()) return false;
  __int128 v = 0;
  bool last_underscore = true;
  for (char c : lower) {
    if (c == '_') {
      if (last_underscore) return false;
      last_underscore = true;
      continue;
    }
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : 99;
    if (d >= base) return false;
    v = v * base + d;
    if (v > static_cast<__int128>(INT64_MAX) + 1) {
      Fail("integer too large (does not fit in 64 bits)");
    }
    last_underscore = false;
  }
  if (last_underscore) return false;
  v = negative ? -v : v;
  if (v > INT64_MAX) Fail("integer too large (does not fit in 64 bits)");
  *out = static_cast<int64_t>(v);
  return true;
}

int64_t FloatToInt(double d) {
  if (std::isnan(d)) Fail("cannot convert float NaN to integer");
  if (std::isinf(d)) Fail("cannot convert float infinity to integer");
  if (d >= 9.3e18 || d <= -9.3e18) Fail("integer too large (does not fit in 64 bits)");
  return static_cast<int64_t>(std::trunc(d));
}

Value Int(Interpreter&, Value v, CallArgs& args) {
  Params p("int", args, {"default", "base"});
  Value fallback = p.Or(0, Value::Int(0));
  int base = p.Has(1) ? static_cast<int>(IntArg("int", *p.Get(1))) : 10;
  if (v.is_undefined()) FailUndefined(v);
  if (v.is_integral()) return Value::Int(v.AsInt());
  if (v.is_float()) return Value::Int(FloatToInt(v.AsFloat()));
  if (v.is_string()) {
    int64_t i;
    if (ParseInt(v.AsString(), base, &i)) return Value::Int(i);
    double d;
    if (ParseFloat(v.AsString(), &d) && std::isfinite(d)) return Value::Int(FloatToInt(d));
  }
  return fallback;
}

Value Float(Interpreter&, Value v, CallArgs& args) {
  Params p("float", args, {"default"});
  if (v.is_undefined()) FailUndefined(v);
  if (v.is_number()) return Value::Float(v.AsFloat());
  double d;
  if (v.is_string() && ParseFloat(v.AsString(), &d)) return Value::Float(d);
  return p.Or(0, Value::Float(0.0));
}

Value Abs(Interpreter&, Value v, CallArgs& args) {
  NoArgs("abs", args);
  if (v.is_undefined()) FailUndefined(v);
  if (v.is_float()) return Value::Float(std::fabs(v.AsFloat()));
  if (v.is_integral()) {
    if (v.AsInt() == INT64_MIN) Fail("integer overflow (the value does not fit in 64 bits)");
    return Value::Int(v.AsInt() < 0 ? -v.AsInt() : v.AsInt());
  }
  Fail(StrCat("bad operand type for abs(): '", TypeName(v), "'"));
}

// Python's round() to `digits` decimals, half to even on the exact binary value.
double RoundFloat(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits > 300) return x;
  if (digits >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(digits), x);
    return std::strtod(buf, nullptr);
  }
  if (digits < -308) return 0.0 * x;
  double scale = std::pow(10.0, static_cast<double>(-digits));
  double y = x / scale;
  double r = std::nearbyint(y);
  return r * scale;
}

Value Round(Interpreter&, Value v, CallArgs& args) {
  Params p("round", args, {"precision", "method"});
  int64_t precision = p.Has(0) ? IntArg("round", *p.Get(0)) : 0;
  std::string method = p.Has(1) ? Str(*p.Get(1)) : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    Fail("method must be common, ceil or floor");
  }
  if (v.is_undefined()) FailUndefined(v);
  if (!v.is_number()) Fail(StrCat("type ", TypeName(v), " doesn't define __round__ method"));
  if (method == "common") {
    if (v.is_integral()) {
      if (precision >= 0) return Value::Int(v.AsInt());
      if (precision < -18) return Value::Int(0);
      int64_t scale = 1;
      for (int64_t i = 0; i < -precision; ++i) scale *= 10;
      int64_t x = v.AsInt();
      int64_t q = x / scale;
      int64_t r = x % scale;
      if (r < 0) {
        r += scale;
        --q;
      }
      if (2 * r > scale || (2 * r == scale && q % 2 != 0)) ++q;
      __int128 rounded = static_cast<__int128>(q) * scale;
      if (rounded > INT64_MAX || rounded < INT64_MIN) {
        Fail("integer overflow (the value does not fit in 64 bits)");
      }
      return Value::Int(static_cast<int64_t>(rounded));
    }
    return Value::Float(RoundFloat(v.AsFloat(), precision));
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.AsFloat() * scale;
  return Value::Float((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

// ---- sequences ----

Value Length(Interpreter&, Value v, CallArgs& args) {
  NoArgs("length", args);
  return Value::Int(Length(v));
}

Value First(Interpreter&, Value v, CallArgs& args) {
  NoArgs("first", args);
  if (v.is_iterator()) {
    Value item;
    if (v.AsIterator().Next(&item)) return item;
    return Value::Undefined("No first item, sequence was empty.");
  }
  if (v.is_sequence()) {
    if (v.Items().empty()) return Value::Undefined("No first item, sequence was empty.");
    return v.Items()[0];
  }
  std::vector<Value> items = Items(v);
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items[0];
}

Value Last(Interpreter&, Value v, CallArgs& args) {
  NoArgs("last", args);
  if (v.is_iterator()) Fail(StrCat("'", TypeName(v), "' object is not reversible"));
  if (v.is_sequence()) {
    if (v.Items().empty()) return Value::Undefined("No last item, sequence was empty.");
    return v.Items().back();
  }
  std::vector<Value> items = Items(v);
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

Value List(Interpreter&, Value v, CallArgs& args) {
  NoArgs("list", args);
  if (v.is_list()) return Value::List(v.Items());
  return Value::List(Items(v));
}

Value ItemsFilter(Interpreter&, Value v, CallArgs& args) {
  NoArgs("items", args);
  auto state = std::make_shared<std::pair<std::vector<Value>, size_t>>();
  bool started = false;
  return Value::Generator(
      [v, state, started](Value* out) mutable {
        if (!started) {
          started = true;
          if (v.is_undefined()) return false;
          if (!v.is_dict()) Fail("Can only get item pairs from a mapping.");
          for (const auto& [k, x] : v.AsDict().entries()) {
            state->first.push_back(Value::Tuple({k, x}));
          }
        }
        if (state->second >= state->first.size()) return false;
        *out = state->first[state->second++];
        return true;
      },
      v.depth() + 2);
}

Value Join(Interpreter&, Value v, CallArgs& args) {
  Params p("join", args, {"d", "attribute"});
  std::string sep = p.Has(0) ? Str(*p.Get(0)) : "";
  Value attribute = p.Or(1, Value::None());
  std::string out;
  bool first = true;
  for (const Value& item : Items(v)) {
    if (!first) out += sep;
    first = false;
    Value x = attribute.is_none() ? item : GetPath(item, attribute);
    out += x.is_string() ? x.AsString() : Str(x);
    if (out.size() > internal::kMaxOutputBytes) internal::FailLimit("string too large");
  }
  return Value::String(std::move(out));
}

Value Default(Interpreter&, Value v, CallArgs& args) {
  Params p("default", args, {"default_value", "boolean"});
  bool boolean = p.Has(1) && Truthy(*p.Get(1));
  if (v.is_undefined() || (boolean && !Truthy(v))) return p.Or(0, Value::String(""));
  return v;
}

Value Reverse(Interpreter&, Value v, CallArgs& args) {
  NoArgs("reverse", args);
  if (v.is_string()) {
    std::u32string s = text::Decode(v.AsString());
    std::reverse(s.begin(), s.end());
    return Value::String(text::Encode(s));
  }
  if (v.is_iterator()) {
    std::vector<Value> items = v.AsIterator().Drain();
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  std::vector<Value> items = Items(v);
  std::reverse(items.begin(), items.end());
  std::string type = v.is_list()   ? "list_reverseiterator"
                     : v.is_dict() ? "dict_reversekeyiterator"
                                   : "reversed";
  return Value::Iterator(std::move(items), type);
}

std::vector<Value> SortKeys(const std::vector<Value>& items, const Value& attribute,
                            bool case_sensitive) {
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (const Value& item : items) {
    Value k = attribute.is_none() ? item : GetPath(item, attribute);
    keys.push_back(case_sensitive ? k : IgnoreCase(k));
  }
  return keys;
}

Value Sort(Interpreter&, Value v, CallArgs& args) {
  Params p("sort", args, {"reverse", "case_sensitive", "attribute"});
  bool reverse = p.Has(0) && Truthy(*p.Get(0));
  bool case_sensitive = p.Has(1) && Truthy(*p.Get(1));
  Value attribute = p.Or(2, Value::None());
  std::vector<Value> items = Items(v);
  // Several attributes: "a,b" sorts by a, then b.
  std::vector<Value> attributes;
  if (attribute.is_string() && attribute.AsString().find(',') != std::string::npos) {
    std::string_view all = attribute.AsString();
    size_t start = 0;
    while (true) {
      size_t comma = all.find(',', start);
      attributes.push_back(Value::String(std::string(all.substr(start, comma - start))));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
  } else {
    attributes.push_back(attribute);
  }
  std::vector<std::vector<Value>> keys;
  for (const Value& a : attributes) keys.push_back(SortKeys(items, a, case_sensitive));
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto key_of = [&](size_t i) {
    if (keys.size() == 1) return keys[0][i];
    std::vector<Value> k;
    for (const auto& ks : keys) k.push_back(ks[i]);
    return Value::List(std::move(k));
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? Less(key_of(b), key_of(a)) : Less(key_of(a), key_of(b));
  });
  std::vector<Value> out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(items[i]);
  return Value::List(std::move(out));
}

Value DictSort(Interpreter&, Value v, CallArgs& args) {
  Params p("dictsort", args, {"case_sensitive", "by", "reverse"});
  bool case_sensitive = p.Has(0) && Truthy(*p.Get(0));
  std::string by = p.Has(1) ? Str(*p.Get(1)) : "key";
  bool reverse = p.Has(2) && Truthy(*p.Get(2));
  if (by != "key" && by != "value") Fail("You can only sort by either \"key\" or \"value\"");
  if (!v.is_dict()) Fail(StrCat("'", TypeName(v), "' object has no attribute 'items'"));
  std::vector<Value> items;
  std::vector<Value> keys;
  for (const auto& [k, x] : v.AsDict().entries()) {
    items.push_back(Value::Tuple({k, x}));
    const Value& key = by == "key" ? k : x;
    keys.push_back(case_sensitive ? key : IgnoreCase(key));
  }
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? Less(keys[b], keys[a]) : Less(keys[a], keys[b]);
  });
  std::vector<Value> out;
  for (size_t i : order) out.push_back(items[i]);
  return Value::List(std::move(out));
}

Value Unique(Interpreter&, Value v, CallArgs& args) {
  Params p("unique", args, {"case_sensitive", "attribute"});
  bool case_sensitive = p.Has(0) && Truthy(*p.Get(0));
  Value attribute = p.Or(1, Value::None());
  auto source = std::make_shared<ItemSource>(v);
  auto seen = std::make_shared<std::vector<Value>>();
  return Value::Generator(
      [source, seen, attribute, case_sensitive](Value* out) {
        Value item;
        while (source->Next(&item)) {
          Value key = attribute.is_none() ? item : GetPath(item, attribute);
          if (!case_sensitive) key = IgnoreCase(key);
          if (key.is_list() || key.is_dict())
            Fail(StrCat("unhashable type: '", TypeName(key), "'"));
          bool duplicate = false;
          for (const Value& s : *seen) {
            if (Equals(s, key)) {
              duplicate = true;
              break;
            }
          }
          if (duplicate) continue;
          seen->push_back(key);
          *out = item;
          return true;
        }
        return false;
      },
      v.depth() + 1);
}

Value MinMax(Value v, CallArgs& args, bool max) {
  Params p(max ? "max" : "min", args, {"case_sensitive", "attribute"});
  bool case_sensitive = p.Has(0) && Truthy(*p.Get(0));
  Value attribute = p.Or(1, Value::None());
  std::vector<Value> items = Items(v);
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  std::vector<Value> keys = SortKeys(items, attribute, case_sensitive);
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    if (max ? Less(keys[best], keys[i]) : Less(keys[i], keys[best])) best = i;
  }
  return items[best];
}

Value Min(Interpreter&, Value v, CallArgs& args) { return MinMax(std::move(v), args, false); }
Value Max(Interpreter&, Value v, CallArgs& args) { return MinMax(std::move(v), args, true); }

Value Sum(Interpreter&, Value v, CallArgs& args) {
  Params p("sum", args, {"attribute", "start"});
  Value attribute = p.Or(0, Value::None());
  Value total = p.Or(1, Value::Int(0));
  for (const Value& item : Items(v)) {
    Value x = attribute.is_none() ? item : GetPath(item, attribute);
    if (x.is_undefined()) FailUndefined(x);
    if (total.is_number() && x.is_number()) {
      if (total.is_float() || x.is_float()) {
        total = Value::Float(total.AsFloat() + x.AsFloat());
      } else {
        __int128 s = static_cast<__int128>(total.AsInt()) + x.AsInt();
        if (s > INT64_MAX || s < INT64_MIN)
          Fail("integer overflow (the value does not fit in 64 bits)");
        total = Value::Int(static_cast<int64_t>(s));
      }
    } else if ((total.is_list() && x.is_list()) || (total.is_tuple() && x.is_tuple())) {
      std::vector<Value> items = total.Items();
      items.insert(items.end(), x.Items().begin(), x.Items().end());
      total = total.is_list() ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
    } else {
      Fail(StrCat("unsupported operand type(s) for +: '", TypeName(total), "' and '", TypeName(x),
                  "'"));
    }
  }
  return total;
}

Value Batch(Interpreter&, Value v, CallArgs& args) {
  Params p("batch", args, {"linecount", "fill_with"}, 1);
  int64_t count = IntArg("batch", *p.Get(0));
  if (count <= 0) Fail("batch size must be positive");
  Value fill = p.Or(1, Value::None());
  auto source = std::make_shared<ItemSource>(v);
  return Value::Generator(
      [source, count, fill](Value* out) {
        std::vector<Value> tmp;
        Value item;
        while (static_cast<int64_t>(tmp.size()) < count && source->Next(&item)) {
          tmp.push_back(std::move(item));
        }
        if (tmp.empty()) return false;
        if (!fill.is_none()) {
          while (static_cast<int64_t>(tmp.size()) < count) tmp.push_back(fill);
        }
        *out = Value::List(std::move(tmp));
        return true;
      },
      std::max(v.depth(), fill.depth() + 1) + 1);
}

Value SliceFilter(Interpreter&, Value v, CallArgs& args) {
  Params p("slice", args, {"slices", "fill_with"}, 1);
  int64_t slices = IntArg("slice", *p.Get(0));
  if (slices <= 0 || slices > static_cast<int64_t>(internal::kMaxItems))
    Fail("invalid slice count");
  Value fill = p.Or(1, Value::None());
  auto seq = std::make_shared<std::vector<Value>>();
  bool started = false;
  int64_t n = 0;
  return Value::Generator(
      [v, fill, slices, seq, started, n](Value* out) mutable {
        if (!started) {
          started = true;
          *seq = Items(v);
        }
        if (n >= slices) return false;
        auto length = static_cast<int64_t>(seq->size());
        int64_t per = length / slices;
        int64_t extra = length % slices;
        int64_t offset = std::min(n, extra);
        int64_t start = offset + n * per;
        int64_t end = offset + (n < extra ? 1 : 0) + (n + 1) * per;
        std::vector<Value> tmp(seq->begin() + start, seq->begin() + end);
        if (!fill.is_none() && n >= extra) tmp.push_back(fill);
        ++n;
        *out = Value::List(std::move(tmp));
        return true;
      },
      std::max(v.depth(), fill.depth() + 1) + 1);
}

Value Attr(Interpreter&, Value v, CallArgs& args) {
  Params p("attr", args, {"name"}, 1);
  if (v.is_undefined()) FailUndefined(v);
  return GetAttrOnly(v, Str(*p.Get(0)));
}

Value Map(Interpreter& in, Value v, CallArgs& args) {
  bool truthy = Truthy(v);
  auto source = std::make_shared<ItemSource>(v);
  Interpreter* interpreter = &in;
  if (args.args.empty()) {
    Value attribute;
    Value fallback = Value::None();
    bool has_attribute = false;
    for (const auto& [k, x] : args.kwargs) {
      if (k == "attribute") {
        attribute = x;
        has_attribute = true;
      } else if (k == "default") {
        fallback = x;
      } else {
        Fail(StrCat("Unexpected keyword argument '", k, "'"));
      }
    }
    if (!has_attribute) Fail("map requires a filter argument");
    return Value::Generator(
        [truthy, source, attribute, fallback](Value* out) {
          Value item;
          if (!truthy || !source->Next(&item)) return false;
          Value x = GetPath(item, attribute);
          *out = !fallback.is_none() && x.is_undefined() ? fallback : x;
          return true;
        },
        std::max(v.depth(), fallback.depth() + 1) + 1);
  }
  std::string name = Str(args.args[0]);
  auto rest = std::make_shared<CallArgs>();
  rest->args.assign(args.args.begin() + 1, args.args.end());
  rest->kwargs = args.kwargs;
  return Value::Generator(
      [truthy, source, name, rest, interpreter](Value* out) {
        Value item;
        if (!truthy || !source->Next(&item)) return false;
        *out = ApplyFilter(*interpreter, name, item, *rest);
        return true;
      },
      v.depth() + 2);
}

Value SelectOrReject(Interpreter& in, const Value& v, const CallArgs& args, bool select,
                     bool lookup_attr) {
  bool truthy = Truthy(v);
  auto source = std::make_shared<ItemSource>(v);
  size_t off = 0;
  Value attribute;
  if (lookup_attr) {
    if (args.args.empty()) Fail("Missing parameter for attribute name");
    attribute = args.args[0];
    off = 1;
  }
  bool has_test = args.args.size() > off;
  std::string test = has_test ? Str(args.args[off]) : "";
  auto rest = std::make_shared<CallArgs>();
  if (has_test) rest->args.assign(args.args.begin() + off + 1, args.args.end());
  rest->kwargs = args.kwargs;
  Interpreter* interpreter = &in;
  return Value::Generator(
      [truthy, source, lookup_attr, attribute, has_test, test, rest, select,
       interpreter](Value* out) {
        if (!truthy) return false;
        Value item;
        while (source->Next(&item)) {
          Value x = lookup_attr ? GetPath(item, attribute) : item;
          bool ok = has_test ? ApplyTest(*interpreter, test, x, *rest) : Truthy(x);
          if (ok == select) {
            *out = item;
            return true;
          }
        }
        return false;
      },
      v.depth() + 1);
}

Value Select(Interpreter& in, Value v, CallArgs& args) {
  return SelectOrReject(in, v, args, true, false);
}
Value Reject(Interpreter& in, Value v, CallArgs& args) {
  return SelectOrReject(in, v, args, false, false);
}
Value SelectAttr(Interpreter& in, Value v, CallArgs& args) {
  return SelectOrReject(in, v, args, true, true);
}
Value RejectAttr(Interpreter& in, Value v, CallArgs& args) {
  return SelectOrReject(in, v, args, false, true);
}

Value ToJsonFilter(Interpreter&, Value v, CallArgs& args) {
  Params p("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  return Value::String(ToJson(v, p.Has(0) && Truthy(*p.Get(0)), p.Or(1, Value::None()),
                              p.Or(2, Value::None()), p.Has(3) && Truthy(*p.Get(3))));
}

Value PPrint(Interpreter&, Value v, CallArgs& args) {
  NoArgs("pprint", args);
  return Value::String(Repr(v));
}

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};

constexpr FilterEntry kFilters[] = {
    {"abs", Abs},
    {"attr", Attr},
    {"batch", Batch},
    {"capitalize", Capitalize},
    {"center", Center},
    {"count", Length},
    {"d", Default},
    {"default", Default},
    {"dictsort", DictSort},
    {"e", Escape},
    {"escape", Escape},
    {"filesizeformat", FileSizeFormat},
    {"first", First},
    {"float", Float},
    {"forceescape", ForceEscape},
    {"format", Format},
    {"indent", Indent},
    {"int", Int},
    {"items", ItemsFilter},
    {"join", Join},
    {"last", Last},
    {"length", Length},
    {"list", List},
    {"lower", Lower},
    {"map", Map},
    {"max", Max},
    {"min", Min},
    {"pprint", PPrint},
    {"reject", Reject},
    {"rejectattr", RejectAttr},
    {"replace", Replace},
    {"reverse", Reverse},
    {"round", Round},
    {"safe", Safe},
    {"select", Select},
    {"selectattr", SelectAttr},
    {"slice", SliceFilter},
    {"sort", Sort},
    {"string", String},
    {"striptags", StripTags},
    {"sum", Sum},
    {"title", Title},
    {"tojson", ToJsonFilter},
    {"trim", Trim},
    {"truncate", Truncate},
    {"unique", Unique},
    {"upper", Upper},
    {"urlencode", UrlEncode},
    {"wordcount", WordCount},
    {"xmlattr", XmlAttr},
};

// jinja2 filters left out: random output, or text layout nobody's chat
// template uses.
constexpr std::string_view kUnsupported[] = {"random", "urlize", "wordwrap", "groupby"};

FilterFn FindFilter(std::string_view name) {
  for (const FilterEntry& f : kFilters) {
    if (f.name == name) return f.fn;
  }
  return nullptr;
}

}  // namespace

Availability FilterAvailability(std::string_view name) {
  if (FindFilter(name) != nullptr) return Availability::kSupported;
  for (std::string_view u : kUnsupported) {
    if (u == name) return Availability::kUnsupported;
  }
  return Availability::kUnknown;
}

Value ApplyFilter(Interpreter& in, std::string_view name, Value input, CallArgs args) {
  FilterFn fn = FindFilter(name);
  if (fn == nullptr) {
    if (FilterAvailability(name) == Availability::kUnsupported) {
      Fail(StrCat("unsupported filter '", name, "'"));
    }
    Fail(StrCat("No filter named '", name, "' found."));
  }
  // Work in proportion to what the filter goes through.
  if (input.is_string())
    in.Step(1 + static_cast<long long>(input.AsString().size() / 64));
  else if (input.is_sequence())
    in.Step(1 + static_cast<long long>(input.Items().size()));
  else if (input.is_dict())
    in.Step(1 + static_cast<long long>(input.AsDict().size()));
  else
    in.Step();
  return fn(in, std::move(input), args);
}

}  // namespace tandem::jinja
