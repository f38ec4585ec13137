// The global functions: jinja2's range, dict, namespace, cycler and joiner
// (with transformers' dict and namespace), and transformers' raise_exception
// and strftime_now.
#include <time.h>

#include <memory>

#include "absl/time/time.h"
#include "common/strings.h"
#include "engine/tokenizer/jinja/builtins.h"
#include "engine/tokenizer/jinja/call_args.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/text.h"

namespace tandem::jinja {
namespace {

using internal::Fail;

// dict(*args, **kwargs) into `out`.
void FillDict(std::string_view function, const CallArgs& args, DictObject* out) {
  if (args.args.size() > 1) {
    Fail(StrCat(function, " expected at most 1 argument, got ", args.args.size()));
  }
  if (!args.args.empty()) {
    const Value& source = args.args[0];
    if (source.is_dict()) {
      for (const auto& [k, v] : source.AsDict().entries()) out->Set(k, v);
    } else if (source.is_object()) {
      if (auto* ns = dynamic_cast<NamespaceObject*>(source.AsObject())) {
        for (const auto& [k, v] : ns->attrs.entries()) out->Set(k, v);
      } else {
        Fail(StrCat("'", TypeName(source), "' object is not iterable"));
      }
    } else {
      if (source.is_none() || source.is_number()) {
        Fail(StrCat("'", TypeName(source), "' object is not iterable"));
      }
      std::vector<Value> pairs = Iterate(source);
      for (size_t i = 0; i < pairs.size(); ++i) {
        std::vector<Value> kv = Iterate(pairs[i]);
        if (kv.size() != 2) {
          Fail(StrCat("dictionary update sequence element #", i, " has length ", kv.size(),
                      "; 2 is required"));
        }
        out->Set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : args.kwargs) out->Set(Value::String(k), v);
}

Value Range(Interpreter& in, CallArgs& args) {
  if (!args.kwargs.empty()) Fail("range() takes no keyword arguments");
  if (args.args.empty() || args.args.size() > 3) {
    Fail(StrCat("range expected at least 1 argument, got ", args.args.size()));
  }
  int64_t start = 0;
  int64_t stop;
  int64_t step = 1;
  if (args.args.size() == 1) {
    stop = IntArg("range", args.args[0]);
  } else {
    start = IntArg("range", args.args[0]);
    stop = IntArg("range", args.args[1]);
    if (args.args.size() == 3) step = IntArg("range", args.args[2]);
  }
  if (step == 0) Fail("range() arg 3 must not be zero");
  __int128 count = 0;
  if (step > 0 && stop > start) count = (static_cast<__int128>(stop) - start + step - 1) / step;
  if (step < 0 && stop < start) count = (static_cast<__int128>(start) - stop - step - 1) / -step;
  if (count > internal::kMaxRange) {
    Fail(StrCat("Range too big. The sandbox blocks ranges larger than MAX_RANGE (",
                internal::kMaxRange, ")."));
  }
  in.Step(static_cast<long long>(count));
  std::vector<Value> items;
  items.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) items.push_back(Value::Int(start + i * step));
  Value list = Value::List(std::move(items));
  auto* object = static_cast<ListObject*>(list.AsObject());
  object->is_range = true;
  object->start = start;
  object->stop = stop;
  object->step = step;
  return list;
}

Value Namespace(Interpreter& in, CallArgs& args) {
  auto ns = std::make_shared<NamespaceObject>();
  FillDict("namespace", args, &ns->attrs);
  for (const auto& [k, v] : ns->attrs.entries()) {
    if (k.is_string() && !k.AsString().empty() && k.AsString()[0] == '_') {
      Fail("Chat templates cannot store underscore-prefixed attributes on a namespace, but got " +
           text::ReprString(k.AsString()) + ". Please rename the attribute.");
    }
    ns->depth = std::max(ns->depth, v.depth() + 1);
  }
  if (ns->depth > internal::kMaxNesting) internal::FailLimit("value nesting too deep");
  in.Track(ns);
  return Value::FromObject(ns);
}

Value Dict(Interpreter&, CallArgs& args) {
  auto d = std::make_shared<DictObject>();
  FillDict("dict", args, d.get());
  return Value::Dict(std::move(d));
}

Value RaiseException(Interpreter&, CallArgs& args) {
  Params p("raise_exception", args, {"message"}, 1);
  throw internal::Error(absl::StatusCode::kInvalidArgument, Str(*p.Get(0)), 0, /*bare=*/true);
}

Value StrftimeNow(Interpreter& in, CallArgs& args) {
  Params p("strftime_now", args, {"format"}, 1);
  if (!p.Get(0)->is_string())
    Fail(StrCat("strftime() argument 1 must be str, not ", TypeName(*p.Get(0))));
  const std::string& format = p.Get(0)->AsString();
  absl::Time now = in.now();
  time_t seconds = static_cast<time_t>(absl::ToUnixSeconds(now));
  int64_t micros = absl::ToUnixMicros(now) - static_cast<int64_t>(seconds) * 1000000;
  if (micros < 0) {
    micros += 1000000;
    --seconds;
  }
  struct tm tm_local;
  localtime_r(&seconds, &tm_local);
  // datetime.strftime handles %f, %z and %Z itself (a naive datetime has no
  // zone); the C library does the rest.
  std::string c_format;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] == '%' && i + 1 < format.size()) {
      char c = format[i + 1];
      if (c == 'f') {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "%06d", static_cast<int>(micros));
        c_format += buf;
        ++i;
        continue;
      }
      if (c == 'z' || c == 'Z') {
        ++i;
        continue;
      }
      if (c == ':' && i + 2 < format.size() && format[i + 2] == 'z') {
        i += 2;
        continue;
      }
      c_format += format.substr(i, 2);
      ++i;
      continue;
    }
    c_format.push_back(format[i]);
  }
  if (c_format.empty()) return Value::String("");
  std::string out(256 + c_format.size() * 8, '\0');
  size_t n = strftime(out.data(), out.size(), c_format.c_str(), &tm_local);
  out.resize(n);
  return Value::String(std::move(out));
}

class CyclerObject : public Object, public std::enable_shared_from_this<CyclerObject> {
 public:
  explicit CyclerObject(std::vector<Value> items) : items_(std::move(items)) {}
  std::string TypeName() const override { return "Cycler"; }
  bool GetAttr(std::string_view name, Value* out) override {
    auto self = shared_from_this();
    if (name == "current") {
      *out = items_[pos_];
    } else if (name == "next") {
      *out = MakeFunction("<bound method Cycler.next>", [self](Interpreter&, CallArgs& args) {
        NoArgs("next", args);
        Value v = self->items_[self->pos_];
        self->pos_ = (self->pos_ + 1) % self->items_.size();
        return v;
      });
    } else if (name == "reset") {
      *out = MakeFunction("<bound method Cycler.reset>", [self](Interpreter&, CallArgs& args) {
        NoArgs("reset", args);
        self->pos_ = 0;
        return Value::None();
      });
    } else {
      return false;
    }
    return true;
  }

 private:
  std::vector<Value> items_;
  size_t pos_ = 0;
};

Value Cycler(Interpreter&, CallArgs& args) {
  if (args.args.empty()) Fail("at least one item has to be provided");
  return Value::FromObject(std::make_shared<CyclerObject>(args.args));
}

class JoinerObject : public Object {
 public:
  explicit JoinerObject(std::string sep) : sep_(std::move(sep)) {}
  std::string TypeName() const override { return "Joiner"; }
  bool IsCallable() const override { return true; }
  Value Call(Interpreter&, CallArgs args) override {
    NoArgs("joiner", args);
    if (!used_) {
      used_ = true;
      return Value::String("");
    }
    return Value::String(sep_);
  }

 private:
  std::string sep_;
  bool used_ = false;
};

Value Joiner(Interpreter&, CallArgs& args) {
  Params p("joiner", args, {"sep"});
  std::string sep = p.Has(0) ? Str(*p.Get(0)) : ", ";
  return Value::FromObject(std::make_shared<JoinerObject>(sep));
}

}  // namespace

bool LookupGlobal(std::string_view name, Value* out) {
  struct Global {
    std::string_view name;
    Value value;
  };
  static const std::vector<Global>* globals = new std::vector<Global>{
      {"range", MakeFunction("<class 'range'>", Range)},
      {"dict", MakeFunction("<TemplateDict object>", Dict)},
      {"namespace", MakeFunction("<class 'TemplateNamespace'>", Namespace)},
      {"cycler", MakeFunction("<class 'jinja2.utils.Cycler'>", Cycler)},
      {"joiner", MakeFunction("<class 'jinja2.utils.Joiner'>", Joiner)},
      {"raise_exception", MakeFunction("<function raise_exception>", RaiseException)},
      {"strftime_now", MakeFunction("<function strftime_now>", StrftimeNow)},
  };
  for (const Global& g : *globals) {
    if (g.name == name) {
      *out = g.value;
      return true;
    }
  }
  return false;
}

}  // namespace tandem::jinja
