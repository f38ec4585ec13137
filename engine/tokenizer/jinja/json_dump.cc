// tojson: Python's json.dumps, byte for byte (separators, indentation, key
// order, float repr, escapes).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/strings.h"
#include "engine/tokenizer/jinja/builtins.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/text.h"

namespace tandem::jinja {
namespace {

using internal::Fail;

struct Options {
  bool ensure_ascii;
  bool indented;
  std::string indent;
  std::string item_separator;
  std::string key_separator;
  bool sort_keys;
};

void AppendEscaped(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  char buf[16];
  auto escape_unit = [&](unsigned unit) {
    std::snprintf(buf, sizeof(buf), "\\u%04x", unit);
    out->append(buf);
  };
  std::u32string cps;
  bool ascii = text::IsAscii(s);
  if (!ascii && ensure_ascii) cps = text::Decode(s);
  auto one = [&](char32_t c) {
    switch (c) {
      case '"':
        out->append("\\\"");
        return;
      case '\\':
        out->append("\\\\");
        return;
      case '\n':
        out->append("\\n");
        return;
      case '\r':
        out->append("\\r");
        return;
      case '\t':
        out->append("\\t");
        return;
      case '\b':
        out->append("\\b");
        return;
      case '\f':
        out->append("\\f");
        return;
      default:
        break;
    }
    if (c < 0x20) {
      escape_unit(c);
    } else if (c < 0x7F || !ensure_ascii) {
      text::AppendUtf8(c, out);
    } else if (c >= 0x10000) {
      char32_t v = c - 0x10000;
      escape_unit(0xD800 | (v >> 10));
      escape_unit(0xDC00 | (v & 0x3FF));
    } else {
      escape_unit(c);
    }
  };
  if (ensure_ascii && !ascii) {
    for (char32_t c : cps) one(c);
  } else {
    // Without ensure_ascii only ASCII bytes are escaped; the rest is copied.
    for (char c : s) {
      auto u = static_cast<unsigned char>(c);
      if (u >= 0x80) {
        out->push_back(c);
      } else {
        one(u);
      }
    }
  }
  out->push_back('"');
}

std::string FloatText(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return text::ReprFloat(d);
}

// A dict key as json.dumps converts it.
std::string KeyText(const Value& k) {
  switch (k.kind()) {
    case Kind::kString:
      return k.AsString();
    case Kind::kInt:
      return std::to_string(k.AsInt());
    case Kind::kFloat:
      return FloatText(k.AsFloat());
    case Kind::kBool:
      return k.AsBool() ? "true" : "false";
    case Kind::kNone:
      return "null";
    default:
      Fail(StrCat("keys must be str, int, float, bool or None, not ", TypeName(k)));
  }
}

void Dump(const Value& v, const Options& o, int level, std::string* out) {
  if (level > internal::kMaxNesting + 8) internal::FailLimit("value nesting too deep");
  if (out->size() > internal::kMaxOutputBytes) internal::FailLimit("JSON output too large");
  auto newline = [&](int lvl) {
    out->push_back('\n');
    for (int i = 0; i < lvl; ++i) out->append(o.indent);
  };
  switch (v.kind()) {
    case Kind::kNone:
      out->append("null");
      return;
    case Kind::kBool:
      out->append(v.AsBool() ? "true" : "false");
      return;
    case Kind::kInt:
      out->append(std::to_string(v.AsInt()));
      return;
    case Kind::kFloat:
      out->append(FloatText(v.AsFloat()));
      return;
    case Kind::kString:
      AppendEscaped(v.AsString(), o.ensure_ascii, out);
      return;
    case Kind::kList:
    case Kind::kTuple: {
      if (TypeName(v) == "range") Fail("Object of type range is not JSON serializable");
      const auto& items = v.Items();
      if (items.empty()) {
        out->append("[]");
        return;
      }
      out->push_back('[');
      if (o.indented) newline(level + 1);
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) {
          out->append(o.item_separator);
          if (o.indented) newline(level + 1);
        }
        Dump(items[i], o, level + 1, out);
      }
      if (o.indented) newline(level);
      out->push_back(']');
      return;
    }
    case Kind::kDict: {
      const auto& entries = v.AsDict().entries();
      if (entries.empty()) {
        out->append("{}");
        return;
      }
      std::vector<const std::pair<Value, Value>*> order;
      order.reserve(entries.size());
      for (const auto& e : entries) order.push_back(&e);
      if (o.sort_keys) {
        std::stable_sort(order.begin(), order.end(),
                         [](const auto* a, const auto* b) { return Less(a->first, b->first); });
      }
      out->push_back('{');
      if (o.indented) newline(level + 1);
      bool first = true;
      for (const auto* e : order) {
        if (!first) {
          out->append(o.item_separator);
          if (o.indented) newline(level + 1);
        }
        first = false;
        AppendEscaped(KeyText(e->first), o.ensure_ascii, out);
        out->append(o.key_separator);
        Dump(e->second, o, level + 1, out);
      }
      if (o.indented) newline(level);
      out->push_back('}');
      return;
    }
    default:
      Fail(StrCat("Object of type ", TypeName(v), " is not JSON serializable"));
  }
}

}  // namespace

std::string ToJson(const Value& v, bool ensure_ascii, const Value& indent, const Value& separators,
                   bool sort_keys) {
  Options o;
  o.ensure_ascii = ensure_ascii;
  o.sort_keys = sort_keys;
  o.indented = !indent.is_none() && !indent.is_undefined();
  if (o.indented) {
    if (indent.is_string()) {
      o.indent = indent.AsString();
    } else if (indent.is_integral()) {
      o.indent =
          std::string(static_cast<size_t>(std::clamp<int64_t>(indent.AsInt(), 0, 4096)), ' ');
    } else {
      Fail(StrCat("can't multiply sequence by non-int of type '", TypeName(indent), "'"));
    }
  }
  o.item_separator = o.indented ? "," : ", ";
  o.key_separator = ": ";
  if (!separators.is_none() && !separators.is_undefined()) {
    std::vector<Value> parts = Iterate(separators);
    if (parts.size() != 2 || !parts[0].is_string() || !parts[1].is_string()) {
      Fail("separators must be a pair of strings");
    }
    o.item_separator = parts[0].AsString();
    o.key_separator = parts[1].AsString();
  }
  std::string out;
  Dump(v, o, 0, &out);
  return out;
}

}  // namespace tandem::jinja
