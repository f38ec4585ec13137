#include "engine/tokenizer/jinja/call_args.h"

#include "common/strings.h"
#include "engine/tokenizer/jinja/error.h"

namespace tandem::jinja {

using internal::Fail;

Params::Params(std::string_view function, const CallArgs& args,
               std::initializer_list<std::string_view> names, size_t required)
    : values_(names.size()), given_(names.size(), false) {
  std::vector<std::string_view> params(names);
  if (args.args.size() > params.size()) {
    Fail(StrCat(function, "() takes at most ", params.size(), " argument(s) (", args.args.size(),
                " given)"));
  }
  for (size_t i = 0; i < args.args.size(); ++i) {
    values_[i] = args.args[i];
    given_[i] = true;
  }
  for (const auto& [key, value] : args.kwargs) {
    size_t i = 0;
    while (i < params.size() && params[i] != key) ++i;
    if (i == params.size()) {
      Fail(StrCat(function, "() got an unexpected keyword argument '", key, "'"));
    }
    if (given_[i]) Fail(StrCat(function, "() got multiple values for argument '", key, "'"));
    values_[i] = value;
    given_[i] = true;
  }
  for (size_t i = 0; i < required; ++i) {
    if (!given_[i]) Fail(StrCat(function, "() missing required argument '", params[i], "'"));
  }
}

void NoArgs(std::string_view function, const CallArgs& args) {
  if (!args.args.empty() || !args.kwargs.empty()) {
    Fail(StrCat(function, "() takes no arguments"));
  }
}

int64_t IntArg(std::string_view function, const Value& v) {
  if (!v.is_integral()) {
    Fail(StrCat(function, "(): '", TypeName(v), "' object cannot be interpreted as an integer"));
  }
  return v.AsInt();
}

Value MakeFunction(std::string repr, FunctionObject::Fn fn) {
  return Value::FromObject(std::make_shared<FunctionObject>(std::move(repr), std::move(fn)));
}

}  // namespace tandem::jinja
