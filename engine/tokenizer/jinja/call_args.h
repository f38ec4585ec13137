// Calling built-ins: binding positional and keyword arguments to parameters
// as Python does, and functions implemented in C++ as template values.
#ifndef TANDEM_ENGINE_TOKENIZER_JINJA_CALL_ARGS_H_
#define TANDEM_ENGINE_TOKENIZER_JINJA_CALL_ARGS_H_

#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/tokenizer/jinja/value.h"

namespace tandem::jinja {

// Binds `args` to the parameters `names`, of which the first `required` must
// be given; fails as Python does on missing, surplus or unknown arguments.
class Params {
 public:
  Params(std::string_view function, const CallArgs& args,
         std::initializer_list<std::string_view> names, size_t required = 0);
  // The argument for parameter i, or nullptr when not passed.
  const Value* Get(size_t i) const { return given_[i] ? &values_[i] : nullptr; }
  // The argument for parameter i, or `fallback`.
  Value Or(size_t i, Value fallback) const { return given_[i] ? values_[i] : std::move(fallback); }
  bool Has(size_t i) const { return given_[i]; }

 private:
  std::vector<Value> values_;
  std::vector<bool> given_;
};

// Fails unless there are no arguments.
void NoArgs(std::string_view function, const CallArgs& args);

// Integer arguments (bool counts, as in Python).
int64_t IntArg(std::string_view function, const Value& v);

// A built-in function or bound method.
class FunctionObject : public Object {
 public:
  using Fn = std::function<Value(Interpreter&, CallArgs&)>;
  FunctionObject(std::string repr, Fn fn) : repr_(std::move(repr)), fn_(std::move(fn)) {}
  std::string TypeName() const override { return "builtin_function_or_method"; }
  std::string Repr() const override { return repr_; }
  bool IsCallable() const override { return true; }
  Value Call(Interpreter& in, CallArgs args) override { return fn_(in, args); }

 private:
  std::string repr_;
  Fn fn_;
};

Value MakeFunction(std::string repr, FunctionObject::Fn fn);

}  // namespace tandem::jinja

#endif  // TANDEM_ENGINE_TOKENIZER_JINJA_CALL_ARGS_H_
