#include "engine/tokenizer/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/strings.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/text.h"

namespace tandem::jinja {

using internal::Fail;
using internal::FailLimit;

namespace {

const std::vector<Value> kNoItems;

int ChildDepth(const std::vector<Value>& items) {
  int d = 0;
  for (const Value& v : items) d = std::max(d, v.depth());
  return d;
}

void CheckDepth(int depth) {
  if (depth > internal::kMaxNesting) FailLimit("value nesting too deep");
}

// Recursion guard for repr(), ==, < on values (namespaces can be cyclic).
void CheckRecursion(int level) {
  if (level > internal::kMaxNesting + 8) FailLimit("value nesting too deep");
}

std::string ReprAt(const Value& v, int level);

std::string JoinReprs(const std::vector<Value>& items, int level) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    out += ReprAt(items[i], level + 1);
  }
  return out;
}

std::string DictRepr(const DictObject& d, int level) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : d.entries()) {
    if (!first) out += ", ";
    first = false;
    out += ReprAt(k, level + 1);
    out += ": ";
    out += ReprAt(v, level + 1);
  }
  out += "}";
  return out;
}

std::string ReprAt(const Value& v, int level) {
  CheckRecursion(level);
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kString:
      if (v.is_markup()) return StrCat("Markup(", text::ReprString(v.AsString()), ")");
      return text::ReprString(v.AsString());
    case Kind::kList:
      if (const auto* range = static_cast<const ListObject*>(v.AsObject()); range->is_range) {
        if (range->step == 1) return StrCat("range(", range->start, ", ", range->stop, ")");
        return StrCat("range(", range->start, ", ", range->stop, ", ", range->step, ")");
      }
      return StrCat("[", JoinReprs(v.Items(), level), "]");
    case Kind::kTuple:
      if (v.Items().size() == 1) return StrCat("(", ReprAt(v.Items()[0], level + 1), ",)");
      return StrCat("(", JoinReprs(v.Items(), level), ")");
    case Kind::kDict:
      return DictRepr(v.AsDict(), level);
    case Kind::kIterator:
      return v.AsObject()->Repr();
    case Kind::kObject:
      if (auto* ns = dynamic_cast<NamespaceObject*>(v.AsObject())) {
        return StrCat("<Namespace ", DictRepr(ns->attrs, level), ">");
      }
      return v.AsObject()->Repr();
    default:
      return Str(v);
  }
}

bool EqualsAt(const Value& a, const Value& b, int level) {
  CheckRecursion(level);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      if (a.is_float() && b.is_float()) return a.AsFloat() == b.AsFloat();
      // int vs float: exact, as Python compares them.
      double f = a.is_float() ? a.AsFloat() : b.AsFloat();
      int64_t i = a.is_float() ? b.AsInt() : a.AsInt();
      if (!std::isfinite(f) || f != std::floor(f)) return false;
      if (f < -9.3e18 || f > 9.3e18) return false;
      return static_cast<long double>(f) == static_cast<long double>(i);
    }
    return a.AsInt() == b.AsInt();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.string_ptr() == b.string_ptr() || a.AsString() == b.AsString();
    case Kind::kList:
    case Kind::kTuple: {
      const auto& x = a.Items();
      const auto& y = b.Items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!EqualsAt(x[i], y[i], level + 1)) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const DictObject& x = a.AsDict();
      const DictObject& y = b.AsDict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.entries()) {
        const Value* other = y.Find(k);
        if (other == nullptr || !EqualsAt(v, *other, level + 1)) return false;
      }
      return true;
    }
    default:
      return a.AsObject() == b.AsObject();
  }
}

[[noreturn]] void FailOrder(std::string_view op, const Value& a, const Value& b) {
  Fail(StrCat("'", op, "' not supported between instances of '", TypeName(a), "' and '",
              TypeName(b), "'"));
}

bool CompareAt(std::string_view op, const Value& a, const Value& b, int level) {
  CheckRecursion(level);
  auto apply = [&](auto x, auto y) {
    if (op == "<") return x < y;
    if (op == "<=") return x <= y;
    if (op == ">") return x > y;
    return x >= y;
  };
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      return apply(static_cast<long double>(a.AsFloat()), static_cast<long double>(b.AsFloat()));
    }
    return apply(a.AsInt(), b.AsInt());
  }
  if (a.is_string() && b.is_string()) return apply(a.AsString(), b.AsString());
  if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
    const auto& x = a.Items();
    const auto& y = b.Items();
    size_t n = std::min(x.size(), y.size());
    for (size_t i = 0; i < n; ++i) {
      if (!EqualsAt(x[i], y[i], level + 1)) return CompareAt(op, x[i], y[i], level + 1);
    }
    return apply(x.size(), y.size());
  }
  FailOrder(op, a, b);
}

}  // namespace

Value Value::Undefined(std::string hint, bool unsafe) {
  Value v;
  v.flag_ = unsafe;
  if (!hint.empty()) v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = d;
  return v;
}

Value Value::String(std::string s) {
  return String(std::make_shared<const std::string>(std::move(s)));
}

Value Value::String(std::shared_ptr<const std::string> s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::move(s);
  return v;
}

Value Value::Markup(std::string s) {
  Value v = String(std::move(s));
  v.flag_ = true;
  return v;
}

ListObject::ListObject(std::vector<Value> v) : items(std::move(v)) {
  depth = ChildDepth(items) + 1;
  CheckDepth(depth);
}

Value Value::List(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kList;
  v.object_ = std::make_shared<ListObject>(std::move(items));
  return v;
}

Value Value::Tuple(std::vector<Value> items) {
  Value v = List(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}

Value Value::Dict(std::shared_ptr<DictObject> dict) {
  Value v;
  v.kind_ = Kind::kDict;
  int d = 0;
  for (const auto& [key, value] : dict->entries()) d = std::max({d, key.depth(), value.depth()});
  dict->depth = d + 1;
  CheckDepth(dict->depth);
  v.object_ = std::move(dict);
  return v;
}

Value Value::Iterator(std::vector<Value> items, std::string type_name) {
  int depth = ChildDepth(items) + 1;
  auto shared = std::make_shared<std::vector<Value>>(std::move(items));
  size_t pos = 0;
  return Generator(
      [shared, pos](Value* out) mutable {
        if (pos >= shared->size()) return false;
        *out = (*shared)[pos++];
        return true;
      },
      depth, std::move(type_name));
}

Value Value::Generator(Producer producer, int depth, std::string type_name) {
  Value v;
  v.kind_ = Kind::kIterator;
  auto it = std::make_shared<IteratorObject>(std::move(producer), std::move(type_name));
  it->depth = depth;
  CheckDepth(it->depth);
  v.object_ = std::move(it);
  return v;
}

Value Value::FromObject(std::shared_ptr<Object> object) {
  Value v;
  v.kind_ = Kind::kObject;
  v.object_ = std::move(object);
  return v;
}

const std::vector<Value>& Value::Items() const {
  if (kind_ != Kind::kList && kind_ != Kind::kTuple) return kNoItems;
  return static_cast<const ListObject*>(object_.get())->items;
}

const DictObject& Value::AsDict() const { return *static_cast<const DictObject*>(object_.get()); }

IteratorObject& Value::AsIterator() const { return *static_cast<IteratorObject*>(object_.get()); }

std::string Value::UndefinedMessage() const {
  return s_ != nullptr ? *s_ : std::string("undefined value");
}

int Value::depth() const { return object_ != nullptr ? object_->depth : 0; }

bool Value::SameAs(const Value& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
      return false;
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return b_ == other.b_;
    case Kind::kInt:  // CPython caches small ints
      return i_ == other.i_ && i_ >= -5 && i_ <= 256;
    case Kind::kFloat:
      return false;
    case Kind::kString:
      return s_ == other.s_;
    default:
      return object_ == other.object_;
  }
}

std::string Object::Repr() const { return StrCat("<", TypeName(), " object>"); }

bool Object::GetAttr(std::string_view, Value*) { return false; }

Value Object::Call(Interpreter&, CallArgs) {
  Fail(StrCat("'", TypeName(), "' object is not callable"));
}

const Value* DictObject::Find(std::string_view key) const {
  auto it = string_index_.find(AbslView(key));
  return it == string_index_.end() ? nullptr : &entries_[it->second].second;
}

const Value* DictObject::Find(const Value& key) const {
  if (key.is_string()) return Find(std::string_view(key.AsString()));
  for (const auto& [k, v] : entries_) {
    if (!k.is_string() && Equals(k, key)) return &v;
  }
  return nullptr;
}

void DictObject::Set(Value key, Value value) {
  if (key.is_list() || key.is_dict()) Fail(StrCat("unhashable type: '", jinja::TypeName(key), "'"));
  if (key.is_string()) {
    auto [it, inserted] = string_index_.try_emplace(key.AsString(), entries_.size());
    if (!inserted) {
      entries_[it->second].second = std::move(value);
      return;
    }
    entries_.emplace_back(std::move(key), std::move(value));
    return;
  }
  for (auto& [k, v] : entries_) {
    if (!k.is_string() && Equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
}

void DictObject::Clear() {
  std::vector<std::pair<Value, Value>> old;
  old.swap(entries_);
  string_index_.clear();
}

std::string IteratorObject::Repr() const { return StrCat("<", TypeName(), " object>"); }

bool IteratorObject::Next(Value* out) {
  if (done_) return false;
  if (!producer_(out)) {
    done_ = true;
    producer_ = nullptr;  // frees what the generator held
    return false;
  }
  return true;
}

std::vector<Value> IteratorObject::Drain() {
  std::vector<Value> rest;
  Value v;
  while (Next(&v)) {
    rest.push_back(std::move(v));
    if (rest.size() > internal::kMaxItems) FailLimit("generator too long");
  }
  return rest;
}

std::string NamespaceObject::Repr() const { return StrCat("<Namespace ", DictRepr(attrs, 0), ">"); }

bool NamespaceObject::GetAttr(std::string_view name, Value* out) {
  const Value* v = attrs.Find(name);
  if (v == nullptr) return false;
  *out = *v;
  return true;
}

void NamespaceObject::SetAttr(const std::string& name, Value value) {
  depth = std::max(depth, value.depth() + 1);
  CheckDepth(depth);
  attrs.Set(Value::String(name), std::move(value));
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return v.AsBool();
    case Kind::kInt:
      return v.AsInt() != 0;
    case Kind::kFloat:
      return v.AsFloat() != 0.0;
    case Kind::kString:
      return !v.AsString().empty();
    case Kind::kList:
    case Kind::kTuple:
      return !v.Items().empty();
    case Kind::kDict:
      return v.AsDict().size() > 0;
    default:
      return true;
  }
}

std::string Str(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return v.AsBool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(v.AsInt());
    case Kind::kFloat:
      return text::ReprFloat(v.AsFloat());
    case Kind::kString:
      return v.AsString();
    default:
      return ReprAt(v, 0);
  }
}

std::string Repr(const Value& v) { return ReprAt(v, 0); }

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return v.is_markup() ? "Markup" : "str";
    case Kind::kList:
      return static_cast<const ListObject*>(v.AsObject())->is_range ? "range" : "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    default:
      return v.AsObject()->TypeName();
  }
}

bool Equals(const Value& a, const Value& b) { return EqualsAt(a, b, 0); }

bool Less(const Value& a, const Value& b) { return CompareAt("<", a, b, 0); }

bool Compare(std::string_view op, const Value& a, const Value& b) { return CompareAt(op, a, b, 0); }

int64_t Length(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return static_cast<int64_t>(text::Length(v.AsString()));
    case Kind::kList:
    case Kind::kTuple:
      return static_cast<int64_t>(v.Items().size());
    case Kind::kDict:
      return static_cast<int64_t>(v.AsDict().size());
    default:
      Fail(StrCat("object of type '", TypeName(v), "' has no len()"));
  }
}

std::vector<Value> Iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return {};
    case Kind::kString: {
      std::vector<Value> out;
      const std::string& s = v.AsString();
      if (text::IsAscii(s)) {
        out.reserve(s.size());
        for (char c : s) out.push_back(Value::String(std::string(1, c)));
        return out;
      }
      for (char32_t c : text::Decode(s)) {
        std::string one;
        text::AppendUtf8(c, &one);
        out.push_back(Value::String(std::move(one)));
      }
      return out;
    }
    case Kind::kList:
    case Kind::kTuple:
      return v.Items();
    case Kind::kDict: {
      std::vector<Value> out;
      out.reserve(v.AsDict().size());
      for (const auto& [k, value] : v.AsDict().entries()) out.push_back(k);
      return out;
    }
    case Kind::kIterator:
      return v.AsIterator().Drain();
    default:
      Fail(StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kString:
      if (item.is_undefined()) FailUndefined(item);
      if (!item.is_string()) {
        Fail(StrCat("'in <string>' requires string as left operand, not ", TypeName(item)));
      }
      return container.AsString().find(item.AsString()) != std::string::npos;
    case Kind::kList:
    case Kind::kTuple:
      for (const Value& v : container.Items()) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Kind::kDict:
      if (item.is_list() || item.is_dict()) Fail(StrCat("unhashable type: '", TypeName(item), "'"));
      return container.AsDict().Find(item) != nullptr;
    case Kind::kUndefined:
      return false;
    case Kind::kIterator: {
      Value v;
      while (container.AsIterator().Next(&v)) {
        if (Equals(v, item)) return true;
      }
      return false;
    }
    default:
      Fail(StrCat("argument of type '", TypeName(container), "' is not iterable"));
  }
}

void FailUndefined(const Value& v) { Fail(v.UndefinedMessage()); }

namespace {

Value FromJsonAt(const nlohmann::ordered_json& j, int level) {
  if (level > internal::kMaxNesting) FailLimit("JSON nesting too deep");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::object: {
      auto dict = std::make_shared<DictObject>();
      for (auto it = j.begin(); it != j.end(); ++it) {
        dict->Set(Value::String(it.key()), FromJsonAt(it.value(), level + 1));
      }
      return Value::Dict(std::move(dict));
    }
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(FromJsonAt(item, level + 1));
      return Value::List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::string:
      return Value::String(j.get_ref<const std::string&>());
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Value::Float(static_cast<double>(u));
      }
      return Value::Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    default:
      return Value::None();
  }
}

}  // namespace

Value FromJson(const nlohmann::ordered_json& json) { return FromJsonAt(json, 0); }

}  // namespace tandem::jinja
