// jinja2's tests: `x is defined`, `x is divisibleby 3`, select('equalto', 1)...
#include <algorithm>
#include <cmath>

#include "common/strings.h"
#include "engine/tokenizer/jinja/builtins.h"
#include "engine/tokenizer/jinja/call_args.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/text.h"

namespace tandem::jinja {
namespace {

using internal::Fail;
using TestFn = bool (*)(const Value&, const CallArgs&);

// The one argument of a test such as `x is eq 1` or select('eq', 1).
Value Arg(std::string_view test, const CallArgs& args) {
  Params p(test, args, {"other"}, 1);
  return *p.Get(0);
}

// Python's value % divisor for the odd, even and divisibleby tests (0 when the
// remainder is zero, +-1 for odd integers).
double Remainder(const Value& v, const Value& d) {
  if (v.is_undefined()) FailUndefined(v);
  if (!v.is_number() || !d.is_number()) {
    Fail(StrCat("unsupported operand type(s) for %: '", TypeName(v), "' and '", TypeName(d), "'"));
  }
  if (d.AsFloat() == 0.0) Fail("integer division or modulo by zero");
  if (v.is_integral() && d.is_integral()) {
    if (d.AsInt() == -1) return 0.0;  // INT64_MIN % -1 traps in C++
    int64_t r = v.AsInt() % d.AsInt();
    return static_cast<double>(r);
  }
  return std::fmod(v.AsFloat(), d.AsFloat());
}

bool Odd(const Value& v, const CallArgs& a) {
  NoArgs("odd", a);
  return std::fabs(Remainder(v, Value::Int(2))) == 1.0;
}
bool Even(const Value& v, const CallArgs& a) {
  NoArgs("even", a);
  return Remainder(v, Value::Int(2)) == 0.0;
}
bool DivisibleBy(const Value& v, const CallArgs& a) {
  Params p("divisibleby", a, {"num"}, 1);
  return Remainder(v, *p.Get(0)) == 0.0;
}
bool Defined(const Value& v, const CallArgs& a) {
  NoArgs("defined", a);
  return !v.is_undefined();
}
bool Undefined(const Value& v, const CallArgs& a) { return !Defined(v, a); }
bool None(const Value& v, const CallArgs& a) {
  NoArgs("none", a);
  return v.is_none();
}
bool Boolean(const Value& v, const CallArgs& a) {
  NoArgs("boolean", a);
  return v.is_bool();
}
bool False(const Value& v, const CallArgs& a) { return Boolean(v, a) && !v.AsBool(); }
bool True(const Value& v, const CallArgs& a) { return Boolean(v, a) && v.AsBool(); }
bool Integer(const Value& v, const CallArgs& a) {
  NoArgs("integer", a);
  return v.is_int();
}
bool Float(const Value& v, const CallArgs& a) {
  NoArgs("float", a);
  return v.is_float();
}
bool Number(const Value& v, const CallArgs& a) {
  NoArgs("number", a);
  return v.is_number();
}
bool String(const Value& v, const CallArgs& a) {
  NoArgs("string", a);
  return v.is_string();
}
bool Mapping(const Value& v, const CallArgs& a) {
  NoArgs("mapping", a);
  return v.is_dict();
}
bool Sequence(const Value& v, const CallArgs& a) {
  NoArgs("sequence", a);
  // len() and __getitem__: str, list, tuple, dict, and jinja2's Undefined.
  return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict();
}
bool Iterable(const Value& v, const CallArgs& a) {
  NoArgs("iterable", a);
  return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict() || v.is_iterator() ||
         (v.is_object() && v.AsObject()->TypeName() == "LoopContext");
}
bool Callable(const Value& v, const CallArgs& a) {
  NoArgs("callable", a);
  return v.is_undefined() || (v.is_object() && v.AsObject()->IsCallable());
}
bool Lower(const Value& v, const CallArgs& a) {
  NoArgs("lower", a);
  std::u32string s = text::Decode(Str(v));
  bool cased = false;
  for (char32_t c : s) {
    if (text::IsUpper(c)) return false;
    cased |= text::IsLower(c);
  }
  return cased;
}
bool Upper(const Value& v, const CallArgs& a) {
  NoArgs("upper", a);
  std::u32string s = text::Decode(Str(v));
  bool cased = false;
  for (char32_t c : s) {
    if (text::IsLower(c)) return false;
    cased |= text::IsUpper(c);
  }
  return cased;
}
bool SameAs(const Value& v, const CallArgs& a) { return v.SameAs(Arg("sameas", a)); }
bool Escaped(const Value& v, const CallArgs& a) {
  NoArgs("escaped", a);
  return v.is_markup();
}
bool In(const Value& v, const CallArgs& a) { return Contains(Arg("in", a), v); }
bool IsFilter(const Value& v, const CallArgs& a) {
  NoArgs("filter", a);
  return v.is_string() && FilterAvailability(v.AsString()) != Availability::kUnknown;
}
bool IsTest(const Value& v, const CallArgs& a) {
  NoArgs("test", a);
  return v.is_string() && TestAvailability(v.AsString()) != Availability::kUnknown;
}
bool Eq(const Value& v, const CallArgs& a) { return Equals(v, Arg("eq", a)); }
bool Ne(const Value& v, const CallArgs& a) { return !Equals(v, Arg("ne", a)); }
bool Ordered(std::string_view op, const Value& v, const CallArgs& a) {
  Value other = Arg(op, a);
  if (v.is_undefined()) FailUndefined(v);
  if (other.is_undefined()) FailUndefined(other);
  return Compare(op, v, other);
}
bool Gt(const Value& v, const CallArgs& a) { return Ordered(">", v, a); }
bool Ge(const Value& v, const CallArgs& a) { return Ordered(">=", v, a); }
bool Lt(const Value& v, const CallArgs& a) { return Ordered("<", v, a); }
bool Le(const Value& v, const CallArgs& a) { return Ordered("<=", v, a); }

struct TestEntry {
  std::string_view name;
  TestFn fn;
};

constexpr TestEntry kTests[] = {
    {"odd", Odd},
    {"even", Even},
    {"divisibleby", DivisibleBy},
    {"defined", Defined},
    {"undefined", Undefined},
    {"filter", IsFilter},
    {"test", IsTest},
    {"none", None},
    {"boolean", Boolean},
    {"false", False},
    {"true", True},
    {"integer", Integer},
    {"float", Float},
    {"lower", Lower},
    {"upper", Upper},
    {"string", String},
    {"mapping", Mapping},
    {"number", Number},
    {"sequence", Sequence},
    {"iterable", Iterable},
    {"callable", Callable},
    {"sameas", SameAs},
    {"escaped", Escaped},
    {"in", In},
    {"==", Eq},
    {"eq", Eq},
    {"equalto", Eq},
    {"!=", Ne},
    {"ne", Ne},
    {">", Gt},
    {"gt", Gt},
    {"greaterthan", Gt},
    {">=", Ge},
    {"ge", Ge},
    {"<", Lt},
    {"lt", Lt},
    {"lessthan", Lt},
    {"<=", Le},
    {"le", Le},
};

TestFn FindTest(std::string_view name) {
  for (const TestEntry& t : kTests) {
    if (t.name == name) return t.fn;
  }
  return nullptr;
}

}  // namespace

Availability TestAvailability(std::string_view name) {
  return FindTest(name) != nullptr ? Availability::kSupported : Availability::kUnknown;
}

bool ApplyTest(Interpreter&, std::string_view name, const Value& input, CallArgs args) {
  TestFn fn = FindTest(name);
  if (fn == nullptr) Fail(StrCat("No test named '", name, "' found."));
  return fn(input, args);
}

}  // namespace tandem::jinja
