#include "engine/tokenizer/jinja/format.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/strings.h"
#include "engine/tokenizer/jinja/builtins.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/text.h"

namespace tandem::jinja {
namespace {

using internal::Fail;

struct Spec {
  std::string fill = " ";
  char align = 0;  // < > ^ =
  char sign = 0;   // + - space
  bool alternate = false;
  bool zero = false;
  int width = -1;
  char grouping = 0;  // , _
  int precision = -1;
  char type = 0;
};

Spec ParseSpec(std::string_view spec) {
  Spec s;
  std::u32string cps = text::Decode(spec);
  size_t i = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (cps.size() >= 2 && is_align(cps[1])) {
    s.fill.clear();
    text::AppendUtf8(cps[0], &s.fill);
    s.align = static_cast<char>(cps[1]);
    i = 2;
  } else if (!cps.empty() && is_align(cps[0])) {
    s.align = static_cast<char>(cps[0]);
    i = 1;
  }
  if (i < cps.size() && (cps[i] == '+' || cps[i] == '-' || cps[i] == ' ')) {
    s.sign = static_cast<char>(cps[i++]);
  }
  if (i < cps.size() && cps[i] == 'z') ++i;
  if (i < cps.size() && cps[i] == '#') {
    s.alternate = true;
    ++i;
  }
  if (i < cps.size() && cps[i] == '0') {
    s.zero = true;
    ++i;
  }
  auto number = [&]() {
    int v = 0;
    size_t start = i;
    while (i < cps.size() && cps[i] >= '0' && cps[i] <= '9') {
      v = v * 10 + static_cast<int>(cps[i] - '0');
      if (v > 100000) Fail("Too many decimal digits in format string");
      ++i;
    }
    return i > start ? v : -1;
  };
  s.width = number();
  if (i < cps.size() && (cps[i] == ',' || cps[i] == '_')) s.grouping = static_cast<char>(cps[i++]);
  if (i < cps.size() && cps[i] == '.') {
    ++i;
    s.precision = number();
    if (s.precision < 0) Fail("Format specifier missing precision");
  }
  if (i < cps.size()) s.type = static_cast<char>(cps[i++]);
  if (i < cps.size()) Fail("Invalid format specifier");
  return s;
}

const std::string kZero = "0";

std::string Pad(const std::string& body, const Spec& s, char default_align, size_t sign_len = 0) {
  if (s.width < 0) return body;
  size_t len = text::Length(body);
  if (len >= static_cast<size_t>(s.width)) return body;
  size_t pad = s.width - len;
  char align = s.align != 0 ? s.align : default_align;
  bool zero_fill = s.zero && s.align == 0;
  if (zero_fill && default_align == '>') align = '=';
  const std::string& fill = zero_fill ? kZero : s.fill;
  auto repeat = [&](size_t n) {
    std::string out;
    for (size_t k = 0; k < n; ++k) out += fill;
    return out;
  };
  switch (align) {
    case '<':
      return body + repeat(pad);
    case '^':
      return repeat(pad / 2) + body + repeat(pad - pad / 2);
    case '=':
      return body.substr(0, sign_len) + repeat(pad) + body.substr(sign_len);
    default:
      return repeat(pad) + body;
  }
}

std::string Group(const std::string& digits, char sep, int every) {
  if (sep == 0) return digits;
  std::string out;
  int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % every == 0) out.push_back(sep);
    out.push_back(digits[i]);
  }
  return out;
}

std::string SignPrefix(bool negative, char sign) {
  if (negative) return "-";
  if (sign == '+') return "+";
  if (sign == ' ') return " ";
  return "";
}

std::string FormatInt(int64_t v, const Spec& s) {
  if (s.precision >= 0) Fail("Precision not allowed in integer format specifier");
  if (s.type == 'c') {
    std::string out;
    text::AppendUtf8(static_cast<char32_t>(v), &out);
    return Pad(out, s, '<');
  }
  bool negative = v < 0;
  uint64_t mag = negative ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::string digits;
  const char* prefix = "";
  int base = 10;
  switch (s.type) {
    case 'b':
      base = 2;
      prefix = "0b";
      break;
    case 'o':
      base = 8;
      prefix = "0o";
      break;
    case 'x':
      base = 16;
      prefix = "0x";
      break;
    case 'X':
      base = 16;
      prefix = "0X";
      break;
    default:
      break;
  }
  const char* alphabet = s.type == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
  do {
    digits.insert(digits.begin(), alphabet[mag % base]);
    mag /= base;
  } while (mag > 0);
  digits = Group(digits, s.grouping, base == 10 ? 3 : 4);
  std::string head = SignPrefix(negative, s.sign);
  if (s.alternate) head += prefix;
  return Pad(head + digits, s, '>', head.size());
}

std::string FormatFloat(double v, const Spec& s) {
  char type = s.type;
  if (type == 0 && s.precision < 0) {
    std::string r = text::ReprFloat(v);
    bool negative = !r.empty() && r[0] == '-';
    std::string body = negative ? r.substr(1) : r;
    std::string head = SignPrefix(negative, s.sign);
    return Pad(head + body, s, '>', head.size());
  }
  bool percent = type == '%';
  double x = percent ? v * 100 : v;
  bool negative = std::signbit(x) && !std::isnan(x);
  double mag = std::fabs(x);
  char conv = type == 0 ? 'g' : percent ? 'f' : type == 'n' ? 'g' : type;
  if (conv != 'e' && conv != 'E' && conv != 'f' && conv != 'F' && conv != 'g' && conv != 'G') {
    Fail(StrCat("Unknown format code '", std::string(1, type), "' for object of type 'float'"));
  }
  int precision = s.precision >= 0 ? s.precision : 6;
  if (type == 0 && precision == 0) precision = 1;
  char fmt[16];
  std::snprintf(fmt, sizeof(fmt), "%%%s.%d%c", s.alternate ? "#" : "", precision, conv);
  char buf[512];
  std::snprintf(buf, sizeof(buf), fmt, mag);
  std::string body = buf;
  if (type == 0 && std::isfinite(mag) && body.find_first_of(".e") == std::string::npos) {
    body += ".0";
  }
  if (s.grouping != 0) {
    size_t end = body.find_first_not_of("0123456789");
    if (end == std::string::npos) end = body.size();
    body = Group(body.substr(0, end), s.grouping, 3) + body.substr(end);
  }
  if (percent) body += "%";
  std::string head = SignPrefix(negative, s.sign);
  return Pad(head + body, s, '>', head.size());
}

}  // namespace

std::string FormatValue(const Value& v, std::string_view spec_text) {
  if (spec_text.empty()) return Str(v);
  Spec s = ParseSpec(spec_text);
  if (v.is_string()) {
    if (s.type != 0 && s.type != 's') {
      Fail(StrCat("Unknown format code '", std::string(1, s.type), "' for object of type 'str'"));
    }
    std::string body = v.AsString();
    if (s.precision >= 0) {
      std::u32string cps = text::Decode(body);
      if (cps.size() > static_cast<size_t>(s.precision)) cps.resize(s.precision);
      body = text::Encode(cps);
    }
    return Pad(body, s, '<');
  }
  if (v.is_integral()) {
    if (s.type == 0 && v.is_bool()) return Pad(Str(v), s, '<');
    if (s.type == 'e' || s.type == 'E' || s.type == 'f' || s.type == 'F' || s.type == 'g' ||
        s.type == 'G' || s.type == '%') {
      return FormatFloat(v.AsFloat(), s);
    }
    if (s.type != 0 && s.type != 'd' && s.type != 'n' && s.type != 'b' && s.type != 'o' &&
        s.type != 'x' && s.type != 'X' && s.type != 'c') {
      Fail(StrCat("Unknown format code '", std::string(1, s.type), "' for object of type 'int'"));
    }
    return FormatInt(v.AsInt(), s);
  }
  if (v.is_float()) return FormatFloat(v.AsFloat(), s);
  Fail(StrCat("unsupported format string passed to ", TypeName(v), ".__format__"));
}

std::string StrFormat(std::string_view fmt, const CallArgs& args, bool markup) {
  std::string out;
  size_t auto_index = 0;
  bool used_auto = false;
  bool used_manual = false;
  for (size_t i = 0; i < fmt.size();) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      Fail("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      i += 2;
      continue;
    }
    // {field!conv:spec}, with nested {} in the spec.
    size_t j = i + 1;
    int depth = 1;
    while (j < fmt.size() && depth > 0) {
      if (fmt[j] == '{') ++depth;
      if (fmt[j] == '}') --depth;
      if (depth > 0) ++j;
    }
    if (j >= fmt.size()) Fail("expected '}' before end of string");
    std::string_view field = fmt.substr(i + 1, j - i - 1);
    i = j + 1;
    std::string_view spec;
    char conversion = 0;
    size_t colon = std::string_view::npos;
    size_t bang = std::string_view::npos;
    int brackets = 0;
    for (size_t k = 0; k < field.size(); ++k) {
      if (field[k] == '[') ++brackets;
      if (field[k] == ']') --brackets;
      if (brackets == 0 && field[k] == '!' && bang == std::string_view::npos) bang = k;
      if (brackets == 0 && field[k] == ':') {
        colon = k;
        break;
      }
    }
    if (colon != std::string_view::npos) spec = field.substr(colon + 1);
    std::string_view name = field.substr(0, std::min(colon, bang));
    if (bang != std::string_view::npos && bang < colon) {
      std::string_view conv = field.substr(bang + 1, std::min(colon, field.size()) - bang - 1);
      if (conv.size() != 1) Fail("expected ':' after conversion specifier");
      conversion = conv[0];
    }
    size_t end = name.find_first_of(".[");
    std::string_view head = name.substr(0, end);
    Value v;
    if (head.empty()) {
      if (used_manual) {
        Fail("cannot switch from manual field specification to automatic field numbering");
      }
      used_auto = true;
      if (auto_index >= args.args.size()) {
        Fail(StrCat("Replacement index ", auto_index, " out of range for positional args tuple"));
      }
      v = args.args[auto_index++];
    } else if (head.find_first_not_of("0123456789") == std::string_view::npos) {
      if (used_auto) {
        Fail("cannot switch from automatic field numbering to manual field specification");
      }
      used_manual = true;
      size_t index = std::strtoul(std::string(head).c_str(), nullptr, 10);
      if (index >= args.args.size()) {
        Fail(StrCat("Replacement index ", index, " out of range for positional args tuple"));
      }
      v = args.args[index];
    } else {
      bool found = false;
      for (const auto& [key, value] : args.kwargs) {
        if (key == head) {
          v = value;
          found = true;
        }
      }
      if (!found) Fail(StrCat("'", head, "'"));
    }
    // .attr and [key] accessors.
    for (size_t k = end; k != std::string_view::npos && k < name.size();) {
      if (name[k] == '.') {
        size_t next = name.find_first_of(".[", k + 1);
        v = GetAttr(v, name.substr(k + 1, next - k - 1));
        k = next;
      } else {
        size_t close = name.find(']', k);
        if (close == std::string_view::npos) Fail("Missing ']' in format string");
        std::string_view key = name.substr(k + 1, close - k - 1);
        Value key_value =
            !key.empty() && key.find_first_not_of("0123456789") == std::string_view::npos
                ? Value::Int(std::strtoll(std::string(key).c_str(), nullptr, 10))
                : Value::String(std::string(key));
        v = GetItem(v, key_value);
        k = close + 1;
      }
      if (v.is_undefined()) FailUndefined(v);
    }
    if (conversion == 'r' || conversion == 'a') {
      v = Value::String(Repr(v));
    } else if (conversion == 's') {
      v = Value::String(Str(v));
    } else if (conversion != 0) {
      Fail(StrCat("Unknown conversion specifier ", std::string(1, conversion)));
    }
    std::string spec_text =
        spec.find('{') != std::string_view::npos ? StrFormat(spec, args, false) : std::string(spec);
    std::string piece = FormatValue(v, spec_text);
    out += markup && !v.is_markup() ? text::HtmlEscape(piece) : piece;
    if (out.size() > internal::kMaxOutputBytes) internal::FailLimit("string too large");
  }
  return out;
}

Value PercentFormat(const Value& format, const Value& args) {
  const std::string& f = format.AsString();
  bool markup = format.is_markup();
  std::vector<Value> positional;
  const DictObject* mapping = args.is_dict() ? &args.AsDict() : nullptr;
  if (args.is_tuple()) {
    positional = args.Items();
  } else {
    positional.push_back(args);
  }
  size_t next = 0;
  auto take = [&]() -> Value {
    if (next >= positional.size()) Fail("not enough arguments for format string");
    return positional[next++];
  };
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < f.size();) {
    if (f[i] != '%') {
      out.push_back(f[i++]);
      continue;
    }
    ++i;
    if (i >= f.size()) Fail("incomplete format");
    Value arg;
    bool have_arg = false;
    if (f[i] == '(') {
      size_t close = f.find(')', i);
      if (close == std::string::npos) Fail("incomplete format key");
      if (mapping == nullptr) Fail("format requires a mapping");
      const Value* v = mapping->Find(std::string_view(f).substr(i + 1, close - i - 1));
      if (v == nullptr) Fail(StrCat("'", f.substr(i + 1, close - i - 1), "'"));
      arg = *v;
      have_arg = true;
      used_mapping = true;
      i = close + 1;
    }
    std::string flags;
    while (i < f.size() && std::string_view("#0- +").find(f[i]) != std::string_view::npos) {
      flags.push_back(f[i++]);
    }
    auto number = [&]() -> int {
      if (i < f.size() && f[i] == '*') {
        ++i;
        Value w = take();
        if (!w.is_integral()) Fail("* wants int");
        return static_cast<int>(w.AsInt());
      }
      int v = -1;
      while (i < f.size() && f[i] >= '0' && f[i] <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (f[i++] - '0');
        if (v > 100000) Fail("width too big");
      }
      return v;
    };
    int width = number();
    int precision = -1;
    if (i < f.size() && f[i] == '.') {
      ++i;
      precision = number();
      if (precision < 0) precision = 0;
    }
    while (i < f.size() && (f[i] == 'h' || f[i] == 'l' || f[i] == 'L')) ++i;
    if (i >= f.size()) Fail("incomplete format");
    char type = f[i++];
    if (type == '%') {
      out.push_back('%');
      continue;
    }
    if (!have_arg) arg = take();
    bool left = flags.find('-') != std::string::npos;
    std::string body;
    switch (type) {
      case 's':
      case 'r':
      case 'a': {
        body = type == 's' ? Str(arg) : Repr(arg);
        if (markup && !arg.is_markup()) body = text::HtmlEscape(body);
        if (precision >= 0) {
          std::u32string cps = text::Decode(body);
          if (cps.size() > static_cast<size_t>(precision)) cps.resize(precision);
          body = text::Encode(cps);
        }
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o': {
        int64_t v;
        if (arg.is_integral()) {
          v = arg.AsInt();
        } else if (arg.is_float() && (type == 'd' || type == 'i' || type == 'u')) {
          if (!std::isfinite(arg.AsFloat())) Fail("cannot convert float to integer");
          v = static_cast<int64_t>(std::trunc(arg.AsFloat()));
        } else {
          Fail(StrCat("%", std::string(1, type), " format: ",
                      type == 'x' || type == 'X' || type == 'o' ? "an integer" : "a real number",
                      " is required, not ", TypeName(arg)));
        }
        std::string spec = flags.find('#') != std::string::npos ? "#" : "";
        if (flags.find('+') != std::string::npos) spec.insert(0, "+");
        if (flags.find(' ') != std::string::npos) spec.insert(0, " ");
        char conv = type == 'i' || type == 'u' ? 'd' : type;
        std::string fmt_text = StrCat("%", spec);
        if (precision >= 0) absl::StrAppend(&fmt_text, ".", precision);
        fmt_text += "ll";
        fmt_text.push_back(conv);
        char buf[128];
        std::snprintf(buf, sizeof(buf), fmt_text.c_str(), static_cast<long long>(v));
        body = buf;
        if (type == 'o' && spec.find('#') != std::string::npos) {
          size_t zero = body.find('0');
          if (zero != std::string::npos) body.insert(zero + 1, "o");
        }
        if (flags.find('0') != std::string::npos && !left && width > 0 &&
            body.size() < static_cast<size_t>(width)) {
          size_t sign = (body[0] == '-' || body[0] == '+' || body[0] == ' ') ? 1 : 0;
          if (body.compare(sign, 2, "0x") == 0 || body.compare(sign, 2, "0X") == 0 ||
              body.compare(sign, 2, "0o") == 0) {
            sign += 2;
          }
          body.insert(sign, std::string(width - body.size(), '0'));
        }
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        if (!arg.is_number()) {
          Fail(StrCat("must be real number, not ", TypeName(arg)));
        }
        std::string spec;
        for (char fl : flags) {
          if (fl != '-') spec.push_back(fl);
        }
        char fmt[32];
        std::snprintf(fmt, sizeof(fmt), "%%%s%s.%d%c", spec.c_str(),
                      width > 0 && !left ? std::to_string(width).c_str() : "",
                      precision >= 0 ? precision : 6, type);
        char buf[512];
        std::snprintf(buf, sizeof(buf), fmt, arg.AsFloat());
        body = buf;
        break;
      }
      case 'c':
        if (arg.is_integral()) {
          text::AppendUtf8(static_cast<char32_t>(arg.AsInt()), &body);
        } else if (arg.is_string() && text::Length(arg.AsString()) == 1) {
          body = arg.AsString();
        } else {
          Fail("%c requires an int or a unicode character");
        }
        break;
      default:
        Fail(StrCat("unsupported format character '", std::string(1, type), "'"));
    }
    size_t len = text::Length(body);
    if (width > 0 && len < static_cast<size_t>(width)) {
      std::string pad(width - len, ' ');
      body = left ? body + pad : pad + body;
    }
    out += body;
    if (out.size() > internal::kMaxOutputBytes) internal::FailLimit("string too large");
  }
  // Like CPython, a non-tuple argument with __getitem__ (a list, a dict) is a
  // mapping that need not be used up.
  bool mapping_like = !args.is_tuple() && !args.is_string() && (args.is_list() || args.is_dict());
  if (!used_mapping && !mapping_like && next < positional.size()) {
    Fail("not all arguments converted during string formatting");
  }
  return markup ? Value::Markup(std::move(out)) : Value::String(std::move(out));
}

}  // namespace tandem::jinja
