// The values templates compute with, and Python's semantics for them: a
// value is what a Python object would be under jinja2 (None, bool, int, float,
// str, list, tuple, dict, jinja2's Undefined, a generator, or an object such
// as a namespace, a macro or a loop). Strings are UTF-8; lists, tuples and
// dicts are immutable once built (jinja2's ImmutableSandboxedEnvironment
// forbids mutating them), so they are shared, never copied. Only namespaces
// change after they are made.
#ifndef TANDEM_ENGINE_TOKENIZER_JINJA_VALUE_H_
#define TANDEM_ENGINE_TOKENIZER_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "nlohmann/json.hpp"

namespace tandem::jinja {

class Interpreter;
class Object;
class Value;
// A generator's body: sets *out to the next item and returns true, or
// returns false at the end.
using Producer = std::function<bool(Value*)>;
class DictObject;
class IteratorObject;

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kDict,
  kIterator,  // a Python generator or iterator: truthy, no len(), consumed once
  kObject,
};

class Value {
 public:
  Value() : kind_(Kind::kUndefined), i_(0) {}

  // jinja2's Undefined. `hint` is the error raised where it is used ("'x' is
  // undefined"); `unsafe` marks the sandbox's undefined for forbidden
  // attributes, whose use is a SecurityError.
  static Value Undefined(std::string hint = "", bool unsafe = false);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value String(std::shared_ptr<const std::string> s);
  // markupsafe.Markup: a str that HTML-escapes what is added to it.
  static Value Markup(std::string s);
  static Value List(std::vector<Value> items);
  static Value Tuple(std::vector<Value> items);
  static Value Dict(std::shared_ptr<DictObject> dict);
  static Value Iterator(std::vector<Value> items, std::string type_name = "generator");
  // A lazy generator whose items nest at most `depth` - 1 deep.
  static Value Generator(Producer producer, int depth, std::string type_name = "generator");
  static Value FromObject(std::shared_ptr<Object> object);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // bool, int or float (Python's numbers.Number).
  bool is_number() const {
    return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat;
  }
  // bool or int (Python's int, of which bool is a subclass).
  bool is_integral() const { return kind_ == Kind::kBool || kind_ == Kind::kInt; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_markup() const { return kind_ == Kind::kString && flag_; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kTuple; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_iterator() const { return kind_ == Kind::kIterator; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_unsafe_undefined() const { return kind_ == Kind::kUndefined && flag_; }

  bool AsBool() const { return b_; }
  int64_t AsInt() const { return kind_ == Kind::kBool ? (b_ ? 1 : 0) : i_; }
  double AsFloat() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(AsInt()); }
  const std::string& AsString() const { return *s_; }
  const std::shared_ptr<const std::string>& string_ptr() const { return s_; }
  // The items of a list or tuple.
  const std::vector<Value>& Items() const;
  const DictObject& AsDict() const;
  IteratorObject& AsIterator() const;
  Object* AsObject() const { return object_.get(); }
  const std::shared_ptr<Object>& object_ptr() const { return object_; }
  // The error an undefined value raises where it is used.
  std::string UndefinedMessage() const;

  // How deeply containers nest in this value (0 for scalars).
  int depth() const;
  // Whether two values are the same Python object (the `sameas` test).
  bool SameAs(const Value& other) const;

 private:
  Kind kind_;
  bool flag_ = false;  // strings: Markup; undefined: unsafe
  union {
    bool b_;
    int64_t i_;
    double f_;
  };
  std::shared_ptr<const std::string> s_;  // strings; undefined: the hint
  std::shared_ptr<Object> object_;        // lists, tuples, dicts, iterators, objects
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
};

// Everything held by reference: containers, generators, namespaces, macros,
// loops and the like.
class Object {
 public:
  virtual ~Object() = default;
  // Python's type name, as error messages and reprs show it.
  virtual std::string TypeName() const = 0;
  virtual std::string Repr() const;
  // getattr(): true with the attribute in *out, false when there is none.
  virtual bool GetAttr(std::string_view name, Value* out);
  virtual bool IsCallable() const { return false; }
  virtual Value Call(Interpreter& interpreter, CallArgs args);
  int depth = 1;
};

class ListObject : public Object {
 public:
  explicit ListObject(std::vector<Value> v);
  std::string TypeName() const override { return is_range ? "range" : "list"; }
  std::vector<Value> items;
  // range(): a list as templates use it, printed as Python prints a range.
  bool is_range = false;
  int64_t start = 0;
  int64_t stop = 0;
  int64_t step = 1;
};

class DictObject : public Object {
 public:
  std::string TypeName() const override { return "dict"; }
  // nullptr when the key is missing.
  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
  // Inserts, or replaces the value in place (keeping the key's position).
  void Set(Value key, Value value);
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  void Clear();

 private:
  std::vector<std::pair<Value, Value>> entries_;
  absl::flat_hash_map<std::string, size_t> string_index_;
};

// A Python generator or iterator: produces its items on demand (filters
// such as map and select are lazy in jinja2, so an error in an item that is
// never reached never happens), once.
class IteratorObject : public Object {
 public:
  IteratorObject(Producer producer, std::string type_name)
      : producer_(std::move(producer)), type_name_(std::move(type_name)) {}
  std::string TypeName() const override { return type_name_; }
  std::string Repr() const override;
  // The next item, or false when exhausted.
  bool Next(Value* out);
  // The items not consumed yet; consumes them.
  std::vector<Value> Drain();

 private:
  Producer producer_;
  bool done_ = false;
  std::string type_name_;
};

// jinja2's namespace(): attributes that `{% set ns.x = ... %}` assigns.
class NamespaceObject : public Object {
 public:
  std::string TypeName() const override { return "Namespace"; }
  std::string Repr() const override;
  bool GetAttr(std::string_view name, Value* out) override;
  void SetAttr(const std::string& name, Value value);
  DictObject attrs;
};

// Python semantics.
bool Truthy(const Value& v);
std::string Str(const Value& v);   // str()
std::string Repr(const Value& v);  // repr()
std::string TypeName(const Value& v);
bool Equals(const Value& a, const Value& b);
// a < b; fails with Python's TypeError where the types do not order.
bool Less(const Value& a, const Value& b);
// a op b for op in <, <=, >, >=, failing as Less does.
bool Compare(std::string_view op, const Value& a, const Value& b);
// len(); fails where Python's len() does.
int64_t Length(const Value& v);
// The items iteration yields: a list's items, a str's characters, a dict's
// keys, a generator's remaining items (consuming them); Undefined yields none.
std::vector<Value> Iterate(const Value& v);
// `item in container`; fails where Python's `in` does.
bool Contains(const Value& container, const Value& item);
// Uses an undefined value where jinja2 raises: fails with its message.
[[noreturn]] void FailUndefined(const Value& v);

// The template variables from JSON (objects keep their key order).
Value FromJson(const nlohmann::ordered_json& json);

}  // namespace tandem::jinja

#endif  // TANDEM_ENGINE_TOKENIZER_JINJA_VALUE_H_
