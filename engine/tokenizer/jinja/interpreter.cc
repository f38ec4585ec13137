#include "engine/tokenizer/jinja/interpreter.h"

#include <cmath>
#include <limits>
#include <utility>

#include "common/strings.h"
#include "engine/tokenizer/jinja/builtins.h"
#include "engine/tokenizer/jinja/format.h"
#include "engine/tokenizer/jinja/text.h"

namespace tandem::jinja {
namespace {

using internal::Error;
using internal::Fail;
using internal::FailLimit;

// A macro, or the body of a call block (caller()).
class MacroObject : public Object {
 public:
  MacroObject(const Stmt* stmt, std::string name, FramePtr closure)
      : stmt_(stmt), name_(std::move(name)), closure_(std::move(closure)) {}
  std::string TypeName() const override { return "Macro"; }
  std::string Repr() const override { return StrCat("<Macro ", text::ReprString(name_), ">"); }
  bool IsCallable() const override { return true; }
  Value Call(Interpreter& in, CallArgs args) override {
    return in.CallMacro(*stmt_, name_, closure_, std::move(args));
  }

 private:
  const Stmt* stmt_;
  std::string name_;
  FramePtr closure_;
};

// jinja2's LoopContext: the `loop` variable.
class LoopObject : public Object {
 public:
  LoopObject(std::vector<Value> items, int depth, const Stmt* stmt, FramePtr frame)
      : items_(std::move(items)), depth_(depth), stmt_(stmt), frame_(std::move(frame)) {}
  std::string TypeName() const override { return "LoopContext"; }
  std::string Repr() const override {
    return StrCat("<LoopContext ", index0 + 1, "/", items_.size(), ">");
  }
  bool IsCallable() const override { return true; }
  Value Call(Interpreter& in, CallArgs args) override {
    if (!stmt_->recursive) {
      Fail("Tried to call non recursive loop.  Maybe you forgot the 'recursive' modifier.");
    }
    if (args.args.size() != 1 || !args.kwargs.empty()) Fail("loop() takes exactly one argument");
    return in.RunRecursiveLoop(*stmt_, frame_, args.args[0], depth_ + 1);
  }
  bool GetAttr(std::string_view name, Value* out) override {
    auto n = static_cast<int64_t>(items_.size());
    auto i = static_cast<int64_t>(index0);
    if (name == "index") {
      *out = Value::Int(i + 1);
    } else if (name == "index0") {
      *out = Value::Int(i);
    } else if (name == "revindex") {
      *out = Value::Int(n - i);
    } else if (name == "revindex0") {
      *out = Value::Int(n - i - 1);
    } else if (name == "first") {
      *out = Value::Bool(i == 0);
    } else if (name == "last") {
      *out = Value::Bool(i == n - 1);
    } else if (name == "length") {
      *out = Value::Int(n);
    } else if (name == "depth") {
      *out = Value::Int(depth_);
    } else if (name == "depth0") {
      *out = Value::Int(depth_ - 1);
    } else if (name == "previtem") {
      *out = i > 0 ? items_[index0 - 1] : Value::Undefined("there is no previous item");
    } else if (name == "nextitem") {
      *out = i + 1 < n ? items_[index0 + 1] : Value::Undefined("there is no next item");
    } else {
      return false;
    }
    return true;
  }
  // loop.cycle(...) and loop.changed(...).
  bool CallMethod(std::string_view name, CallArgs& args, Value* out) {
    if (name == "cycle") {
      if (args.args.empty()) Fail("no items for cycling given");
      *out = args.args[index0 % args.args.size()];
      return true;
    }
    if (name == "changed") {
      Value v = Value::Tuple(args.args);
      bool changed = !has_changed_value_ || !Equals(v, changed_value_);
      if (changed) {
        changed_value_ = v;
        has_changed_value_ = true;
      }
      *out = Value::Bool(changed);
      return true;
    }
    return false;
  }
  size_t index0 = 0;

 private:
  std::vector<Value> items_;
  int depth_;
  const Stmt* stmt_;
  FramePtr frame_;
  Value changed_value_;
  bool has_changed_value_ = false;
};

int64_t CheckedInt(__int128 v) {
  if (v > std::numeric_limits<int64_t>::max() || v < std::numeric_limits<int64_t>::min()) {
    Fail("integer overflow (the value does not fit in 64 bits)");
  }
  return static_cast<int64_t>(v);
}

[[noreturn]] void FailOperands(const std::string& op, const Value& a, const Value& b) {
  Fail(StrCat("unsupported operand type(s) for ", op, ": '", TypeName(a), "' and '", TypeName(b),
              "'"));
}

// CPython's float floor division and modulo.
void FloatDivmod(double a, double b, double* div, double* mod) {
  if (b == 0.0) Fail("float floor division by zero");
  double m = std::fmod(a, b);
  double d = (a - m) / b;
  if (m != 0.0) {
    if ((b < 0) != (m < 0)) {
      m += b;
      d -= 1.0;
    }
  } else {
    m = std::copysign(0.0, b);
  }
  double floordiv;
  if (d != 0.0) {
    floordiv = std::floor(d);
    if (d - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, a / b);
  }
  *div = floordiv;
  *mod = m;
}

Value Repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.AsString();
    if (!s.empty() && static_cast<uint64_t>(n) > internal::kMaxOutputBytes / s.size()) {
      FailLimit("string repetition too large");
    }
    std::string out;
    out.reserve(s.size() * n);
    for (int64_t i = 0; i < n; ++i) out += s;
    return seq.is_markup() ? Value::Markup(std::move(out)) : Value::String(std::move(out));
  }
  const auto& items = seq.Items();
  if (!items.empty() && static_cast<uint64_t>(n) > internal::kMaxItems / items.size()) {
    FailLimit("list repetition too large");
  }
  std::vector<Value> out;
  out.reserve(items.size() * n);
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return seq.is_tuple() ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
}

}  // namespace

class Interpreter::DepthGuard {
 public:
  explicit DepthGuard(Interpreter* in) : in_(in) {
    if (++in_->depth_ > internal::kMaxDepth) FailLimit("template recursion too deep");
    in_->stack_.Check();
    in_->Step();
  }
  ~DepthGuard() { --in_->depth_; }

 private:
  Interpreter* in_;
};

Interpreter::Interpreter(const Program& program, const nlohmann::ordered_json& context,
                         absl::Time now)
    : program_(program), now_(now) {
  context_frame_ = std::make_shared<Frame>(nullptr);
  if (!context.is_object() && !context.is_null()) {
    Fail("the template context must be a JSON object");
  }
  if (context.is_object()) {
    for (auto it = context.begin(); it != context.end(); ++it) {
      context_frame_->vars[it.key()] = FromJson(it.value());
    }
  }
  root_ = std::make_shared<Frame>(context_frame_);
}

Interpreter::~Interpreter() {
  for (auto& frame : closures_) frame->vars.clear();
  for (auto& ns : namespaces_) ns->attrs.Clear();
}

std::string Interpreter::Render() {
  std::string out;
  Flow flow = Exec(program_.body, root_, &out);
  (void)flow;
  return out;
}

void Interpreter::Emit(std::string_view text, std::string* out) {
  Step(static_cast<long long>(text.size() / 64));
  out->append(text);
  if (out->size() > internal::kMaxOutputBytes) FailLimit("template output too large");
}

Interpreter::Flow Interpreter::Exec(const Body& body, const FramePtr& frame, std::string* out) {
  for (const StmtPtr& s : body) {
    Flow flow = ExecStmt(*s, frame, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

std::string Interpreter::ExecBlockBody(const Body& body, const FramePtr& frame) {
  std::string buffer;
  auto inner = std::make_shared<Frame>(frame);
  Exec(body, inner, &buffer);
  return buffer;
}

Interpreter::Flow Interpreter::ExecStmt(const Stmt& s, const FramePtr& frame, std::string* out) {
  DepthGuard guard(this);
  try {
    switch (s.kind) {
      case StmtKind::kText:
        Emit(s.text, out);
        return Flow::kNormal;
      case StmtKind::kOutput: {
        Value v = Eval(*s.expr, frame);
        if (v.is_string()) {
          Emit(v.AsString(), out);
        } else {
          Emit(Str(v), out);
        }
        return Flow::kNormal;
      }
      case StmtKind::kIf:
        for (const auto& [cond, body] : s.branches) {
          if (Truthy(Eval(*cond, frame))) return Exec(body, frame, out);
        }
        return Exec(s.else_body, frame, out);
      case StmtKind::kFor:
        ExecFor(s, frame, Eval(*s.expr, frame), 1, out);
        return Flow::kNormal;
      case StmtKind::kSet:
        Assign(s.target, Eval(*s.expr, frame), frame);
        return Flow::kNormal;
      case StmtKind::kSetBlock: {
        std::string buffer;
        auto inner = std::make_shared<Frame>(frame);
        Flow flow = Exec(s.body, inner, &buffer);
        if (flow != Flow::kNormal) return flow;
        Value v = Value::String(std::move(buffer));
        if (s.filter != nullptr) {
          const Value* saved = block_input_;
          block_input_ = &v;
          Value filtered = Eval(*s.filter, inner);
          block_input_ = saved;
          v = std::move(filtered);
        }
        Assign(s.target, std::move(v), frame);
        return Flow::kNormal;
      }
      case StmtKind::kMacro:
        frame->vars[s.text] = Value::FromObject(std::make_shared<MacroObject>(&s, s.text, frame));
        closures_.push_back(frame);
        return Flow::kNormal;
      case StmtKind::kCallBlock: {
        auto caller = Value::FromObject(std::make_shared<MacroObject>(&s, "caller", frame));
        closures_.push_back(frame);
        const Expr& call = *s.expr;
        CallArgs args = EvalArgs(call.call, frame);
        args.kwargs.emplace_back("caller", caller);
        Value callee;
        if (call.a->kind == ExprKind::kGetAttr) {
          Value obj = Eval(*call.a->a, frame);
          if (obj.is_undefined()) FailUndefined(obj);
          callee = GetAttr(obj, call.a->name);
        } else {
          callee = Eval(*call.a, frame);
        }
        Emit(Str(CallValue(callee, std::move(args))), out);
        return Flow::kNormal;
      }
      case StmtKind::kFilterBlock: {
        std::string buffer;
        auto inner = std::make_shared<Frame>(frame);
        Flow flow = Exec(s.body, inner, &buffer);
        Value v = Value::String(std::move(buffer));
        const Value* saved = block_input_;
        block_input_ = &v;
        Value filtered = Eval(*s.expr, inner);
        block_input_ = saved;
        Emit(Str(filtered), out);
        return flow;
      }
      case StmtKind::kGeneration:
        Emit(ExecBlockBody(s.body, frame), out);
        return Flow::kNormal;
      case StmtKind::kWith: {
        auto inner = std::make_shared<Frame>(frame);
        std::vector<Value> values;
        for (const auto& [target, value] : s.assignments) values.push_back(Eval(*value, frame));
        for (size_t i = 0; i < values.size(); ++i) {
          Assign(s.assignments[i].first, std::move(values[i]), inner);
        }
        return Exec(s.body, inner, out);
      }
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
    }
  } catch (Error& e) {
    if (e.line() == 0) e.set_line(s.line);
    throw;
  }
  return Flow::kNormal;
}

void Interpreter::ExecFor(const Stmt& s, const FramePtr& frame, const Value& iterable, int depth,
                          std::string* out) {
  if (iterable.is_none() || iterable.is_number() ||
      (iterable.is_object() && dynamic_cast<LoopObject*>(iterable.AsObject()) == nullptr)) {
    Fail(StrCat("'", TypeName(iterable), "' object is not iterable"));
  }
  std::vector<Value> items = Iterate(iterable);
  Step(static_cast<long long>(items.size()));
  if (s.filter != nullptr) {
    std::vector<Value> kept;
    for (Value& item : items) {
      auto test_frame = std::make_shared<Frame>(frame);
      Assign(s.target, item, test_frame);
      if (Truthy(Eval(*s.filter, test_frame))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    auto inner = std::make_shared<Frame>(frame);
    Exec(s.else_body, inner, out);
    return;
  }
  auto loop = std::make_shared<LoopObject>(items, depth, &s, frame);
  Value loop_value = Value::FromObject(loop);
  if (s.recursive) closures_.push_back(frame);
  for (size_t i = 0; i < items.size(); ++i) {
    Step();
    loop->index0 = i;
    auto inner = std::make_shared<Frame>(frame);
    Assign(s.target, items[i], inner);
    inner->vars["loop"] = loop_value;
    Flow flow = Exec(s.body, inner, out);
    if (flow == Flow::kBreak) break;
  }
}

Value Interpreter::RunRecursiveLoop(const Stmt& stmt, const FramePtr& frame, const Value& iterable,
                                    int depth) {
  DepthGuard guard(this);
  std::string out;
  ExecFor(stmt, frame, iterable, depth, &out);
  return Value::String(std::move(out));
}

void Interpreter::Assign(const Target& t, Value value, const FramePtr& frame) {
  switch (t.kind) {
    case Target::Kind::kName:
      frame->vars[t.name] = std::move(value);
      return;
    case Target::Kind::kTuple: {
      if (value.is_undefined()) FailUndefined(value);
      if (value.is_none() || value.is_number() || value.is_object()) {
        Fail(StrCat("cannot unpack non-iterable ", TypeName(value), " object"));
      }
      std::vector<Value> items = Iterate(value);
      if (items.size() < t.items.size()) {
        Fail(StrCat("not enough values to unpack (expected ", t.items.size(), ", got ",
                    items.size(), ")"));
      }
      if (items.size() > t.items.size()) {
        Fail(StrCat("too many values to unpack (expected ", t.items.size(), ")"));
      }
      for (size_t i = 0; i < items.size(); ++i) Assign(t.items[i], std::move(items[i]), frame);
      return;
    }
    case Target::Kind::kNamespaceAttr: {
      Value ns = Lookup(t.name, frame);
      auto* object = ns.is_object() ? dynamic_cast<NamespaceObject*>(ns.AsObject()) : nullptr;
      if (object == nullptr) Fail("cannot assign attribute on non-namespace object");
      if (!t.attr.empty() && t.attr[0] == '_') {
        Fail("Chat templates cannot store underscore-prefixed attributes on a namespace, but got " +
             text::ReprString(t.attr) + ". Please rename the attribute.");
      }
      object->SetAttr(t.attr, std::move(value));
      return;
    }
  }
}

Value Interpreter::CallMacro(const Stmt& stmt, const std::string& name, const FramePtr& closure,
                             CallArgs args) {
  DepthGuard guard(this);
  auto frame = std::make_shared<Frame>(closure);
  const auto& params = stmt.params;
  std::vector<bool> bound(params.size(), false);
  for (size_t i = 0; i < params.size() && i < args.args.size(); ++i) {
    frame->vars[params[i].name] = args.args[i];
    bound[i] = true;
  }
  auto kwargs = std::make_shared<DictObject>();
  Value caller = Value::None();
  for (auto& [key, value] : args.kwargs) {
    bool matched = false;
    for (size_t i = args.args.size(); i < params.size(); ++i) {
      if (params[i].name == key && !bound[i]) {
        frame->vars[key] = value;
        bound[i] = true;
        matched = true;
        break;
      }
    }
    if (matched) continue;
    if (key == "caller" && stmt.uses_caller) {
      caller = value;
    } else if (stmt.uses_kwargs) {
      kwargs->Set(Value::String(key), value);
    } else if (key == "caller") {
      continue;  // a call block around a macro that never calls caller()
    } else {
      Fail(StrCat("macro '", name, "' takes no keyword argument '", key, "'"));
    }
  }
  if (args.args.size() > params.size() && !stmt.uses_varargs) {
    Fail(StrCat("macro '", name, "' takes not more than ", params.size(), " argument(s)"));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (bound[i]) continue;
    if (params[i].default_value != nullptr) {
      frame->vars[params[i].name] = Eval(*params[i].default_value, frame);
    } else {
      frame->vars[params[i].name] =
          Value::Undefined(StrCat("parameter '", params[i].name, "' was not provided"));
    }
  }
  if (stmt.uses_varargs) {
    std::vector<Value> extra;
    for (size_t i = params.size(); i < args.args.size(); ++i) extra.push_back(args.args[i]);
    frame->vars["varargs"] = Value::Tuple(std::move(extra));
  }
  if (stmt.uses_kwargs) frame->vars["kwargs"] = Value::Dict(kwargs);
  if (stmt.uses_caller) frame->vars["caller"] = caller;
  std::string out;
  Exec(stmt.body, frame, &out);
  return Value::String(std::move(out));
}

Value Interpreter::CallValue(const Value& callee, CallArgs args) {
  if (callee.is_undefined()) FailUndefined(callee);
  if (callee.is_object() && callee.AsObject()->IsCallable()) {
    return callee.AsObject()->Call(*this, std::move(args));
  }
  Fail(StrCat("'", TypeName(callee), "' object is not callable"));
}

Value Interpreter::Lookup(const std::string& name, const FramePtr& frame) {
  for (const Frame* f = frame.get(); f != nullptr; f = f->parent.get()) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return it->second;
  }
  Value global;
  if (LookupGlobal(name, &global)) return global;
  return Value::Undefined(StrCat("'", name, "' is undefined"));
}

CallArgs Interpreter::EvalArgs(const Arguments& a, const FramePtr& frame) {
  CallArgs out;
  out.args.reserve(a.args.size());
  for (const auto& e : a.args) out.args.push_back(Eval(*e, frame));
  for (const auto& k : a.kwargs) out.kwargs.emplace_back(k.name, Eval(*k.value, frame));
  if (a.star_args != nullptr) {
    Value extra = Eval(*a.star_args, frame);
    for (Value& v : Iterate(extra)) out.args.push_back(std::move(v));
  }
  if (a.star_kwargs != nullptr) {
    Value extra = Eval(*a.star_kwargs, frame);
    if (!extra.is_dict())
      Fail(StrCat("argument after ** must be a mapping, not ", TypeName(extra)));
    for (const auto& [k, v] : extra.AsDict().entries()) {
      if (!k.is_string()) Fail("keywords must be strings");
      out.kwargs.emplace_back(k.AsString(), v);
    }
  }
  return out;
}

Value Interpreter::EvalCall(const Expr& e, const FramePtr& frame) {
  const Expr& callee = *e.a;
  if (callee.kind == ExprKind::kGetAttr) {
    Value obj = Eval(*callee.a, frame);
    if (obj.is_undefined()) FailUndefined(obj);
    CallArgs args = EvalArgs(e.call, frame);
    if (obj.is_object()) {
      if (auto* loop = dynamic_cast<LoopObject*>(obj.AsObject())) {
        Value result;
        if (loop->CallMethod(callee.name, args, &result)) return result;
      }
    }
    Value result;
    if (obj.is_string()) Step(static_cast<long long>(obj.AsString().size() / 64));
    if (obj.is_sequence()) Step(static_cast<long long>(obj.Items().size()));
    if (CallMethod(*this, obj, callee.name, args, &result)) return result;
    return CallValue(GetAttr(obj, callee.name), std::move(args));
  }
  Value f = Eval(callee, frame);
  if (f.is_undefined()) FailUndefined(f);
  return CallValue(f, EvalArgs(e.call, frame));
}

Value Interpreter::Eval(const Expr& e, const FramePtr& frame) {
  DepthGuard guard(this);
  switch (e.kind) {
    case ExprKind::kConst:
      return e.value;
    case ExprKind::kName:
      return Lookup(e.name, frame);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const auto& i : e.items) items.push_back(Eval(*i, frame));
      return e.kind == ExprKind::kList ? Value::List(std::move(items))
                                       : Value::Tuple(std::move(items));
    }
    case ExprKind::kDict: {
      auto dict = std::make_shared<DictObject>();
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value key = Eval(*e.items[i], frame);
        dict->Set(std::move(key), Eval(*e.items[i + 1], frame));
      }
      return Value::Dict(std::move(dict));
    }
    case ExprKind::kGetAttr: {
      Value obj = Eval(*e.a, frame);
      if (obj.is_undefined()) FailUndefined(obj);
      return GetAttr(obj, e.name);
    }
    case ExprKind::kGetItem: {
      Value obj = Eval(*e.a, frame);
      if (e.b->kind == ExprKind::kSlice) {
        const Expr& s = *e.b;
        Value start = s.a ? Eval(*s.a, frame) : Value::None();
        Value stop = s.b ? Eval(*s.b, frame) : Value::None();
        Value step = s.c ? Eval(*s.c, frame) : Value::None();
        if (obj.is_undefined()) FailUndefined(obj);
        return Slice(obj, &start, &stop, &step);
      }
      Value key = Eval(*e.b, frame);
      if (obj.is_undefined()) FailUndefined(obj);
      return GetItem(obj, key);
    }
    case ExprKind::kSlice:
      Fail("a slice is only valid in a subscript");
    case ExprKind::kCall:
      return EvalCall(e, frame);
    case ExprKind::kFilter: {
      Value input;
      if (e.a == nullptr) {
        if (block_input_ == nullptr) Fail("filter without input");
        input = *block_input_;
      } else {
        input = Eval(*e.a, frame);
      }
      return ApplyFilter(*this, e.name, std::move(input), EvalArgs(e.call, frame));
    }
    case ExprKind::kTest: {
      Value input = Eval(*e.a, frame);
      return Value::Bool(ApplyTest(*this, e.name, input, EvalArgs(e.call, frame)));
    }
    case ExprKind::kNot:
      return Value::Bool(!Truthy(Eval(*e.a, frame)));
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      Value v = Eval(*e.a, frame);
      if (v.is_undefined()) FailUndefined(v);
      bool neg = e.kind == ExprKind::kNeg;
      if (v.is_float()) return Value::Float(neg ? -v.AsFloat() : v.AsFloat());
      if (v.is_integral())
        return Value::Int(neg ? CheckedInt(-static_cast<__int128>(v.AsInt())) : v.AsInt());
      Fail(StrCat("bad operand type for unary ", neg ? "-" : "+", ": '", TypeName(v), "'"));
    }
    case ExprKind::kBinary: {
      if (e.name == "and") {
        Value left = Eval(*e.a, frame);
        return Truthy(left) ? Eval(*e.b, frame) : left;
      }
      if (e.name == "or") {
        Value left = Eval(*e.a, frame);
        return Truthy(left) ? left : Eval(*e.b, frame);
      }
      Value left = Eval(*e.a, frame);
      Value right = Eval(*e.b, frame);
      return Arith(e.name, left, right);
    }
    case ExprKind::kConcat: {
      std::string out;
      for (const auto& part : e.items) {
        Value v = Eval(*part, frame);
        size_t before = out.size();
        if (v.is_string()) {
          out += v.AsString();
        } else {
          out += Str(v);
        }
        Step(static_cast<long long>((out.size() - before) / 64));
        if (out.size() > internal::kMaxOutputBytes) FailLimit("string too large");
      }
      return Value::String(std::move(out));
    }
    case ExprKind::kCompare: {
      Value left = Eval(*e.a, frame);
      for (const auto& [op, operand] : e.ops) {
        Value right = Eval(*operand, frame);
        if (!CompareOp(op, left, right)) return Value::Bool(false);
        left = std::move(right);
      }
      return Value::Bool(true);
    }
    case ExprKind::kCond:
      if (Truthy(Eval(*e.a, frame))) return Eval(*e.b, frame);
      if (e.c != nullptr) return Eval(*e.c, frame);
      return Value::Undefined(StrCat("the inline if-expression on line ", e.line,
                                     " evaluated to false and no else section was defined."));
  }
  return Value();
}

bool Interpreter::CompareOp(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Equals(a, b);
  if (op == "!=") return !Equals(a, b);
  if (op == "in") return Contains(b, a);
  if (op == "notin") return !Contains(b, a);
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  return Compare(op, a, b);
}

Value Interpreter::Arith(const std::string& op, const Value& a, const Value& b) {
  if (a.is_string()) Step(static_cast<long long>(a.AsString().size() / 64));
  if (a.is_sequence()) Step(static_cast<long long>(a.Items().size()));
  if (a.is_undefined()) FailUndefined(a);
  if (b.is_undefined()) FailUndefined(b);
  bool numbers = a.is_number() && b.is_number();
  bool floats = numbers && (a.is_float() || b.is_float());
  if (op == "+") {
    if (numbers) {
      if (floats) return Value::Float(a.AsFloat() + b.AsFloat());
      return Value::Int(CheckedInt(static_cast<__int128>(a.AsInt()) + b.AsInt()));
    }
    if (a.is_string() && b.is_string()) {
      if (a.is_markup() || b.is_markup()) {
        std::string left = a.is_markup() ? a.AsString() : text::HtmlEscape(a.AsString());
        std::string right = b.is_markup() ? b.AsString() : text::HtmlEscape(b.AsString());
        return Value::Markup(left + right);
      }
      if (a.AsString().size() + b.AsString().size() > internal::kMaxOutputBytes) {
        FailLimit("string too large");
      }
      return Value::String(a.AsString() + b.AsString());
    }
    if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
      if (a.Items().size() + b.Items().size() > internal::kMaxItems) FailLimit("list too large");
      std::vector<Value> items = a.Items();
      items.insert(items.end(), b.Items().begin(), b.Items().end());
      return a.is_list() ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
    }
    if (a.is_string() && !a.is_markup()) {
      Fail(StrCat("can only concatenate str (not \"", TypeName(b), "\") to str"));
    }
    if (a.is_list() || a.is_tuple()) {
      Fail(StrCat("can only concatenate ", TypeName(a), " (not \"", TypeName(b), "\") to ",
                  TypeName(a)));
    }
    FailOperands(op, a, b);
  }
  if (op == "-") {
    if (!numbers) FailOperands(op, a, b);
    if (floats) return Value::Float(a.AsFloat() - b.AsFloat());
    return Value::Int(CheckedInt(static_cast<__int128>(a.AsInt()) - b.AsInt()));
  }
  if (op == "*") {
    if (numbers) {
      if (floats) return Value::Float(a.AsFloat() * b.AsFloat());
      return Value::Int(CheckedInt(static_cast<__int128>(a.AsInt()) * b.AsInt()));
    }
    if ((a.is_string() || a.is_sequence()) && b.is_integral()) return Repeat(a, b.AsInt());
    if (a.is_integral() && (b.is_string() || b.is_sequence())) return Repeat(b, a.AsInt());
    Fail(StrCat("can't multiply sequence by non-int of type '", TypeName(a.is_integral() ? a : b),
                "'"));
  }
  if (op == "/") {
    if (!numbers) FailOperands(op, a, b);
    if (b.AsFloat() == 0.0) Fail(floats ? "float division by zero" : "division by zero");
    if (!floats) {
      return Value::Float(static_cast<double>(static_cast<long double>(a.AsInt()) /
                                              static_cast<long double>(b.AsInt())));
    }
    return Value::Float(a.AsFloat() / b.AsFloat());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) return PercentFormat(a, b);
    if (!numbers) FailOperands(op, a, b);
    if (floats) {
      double div;
      double mod;
      if (b.AsFloat() == 0.0) Fail(op == "//" ? "float floor division by zero" : "float modulo");
      FloatDivmod(a.AsFloat(), b.AsFloat(), &div, &mod);
      return Value::Float(op == "//" ? div : mod);
    }
    int64_t x = a.AsInt();
    int64_t y = b.AsInt();
    if (y == 0) Fail("integer division or modulo by zero");
    if (x == std::numeric_limits<int64_t>::min() && y == -1) {
      if (op == "%") return Value::Int(0);
      Fail("integer overflow (the value does not fit in 64 bits)");
    }
    int64_t q = x / y;
    int64_t r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) {
      --q;
      r += y;
    }
    return Value::Int(op == "//" ? q : r);
  }
  if (op == "**") {
    if (!numbers) FailOperands(op, a, b);
    if (!floats && b.AsInt() >= 0) {
      int64_t base = a.AsInt();
      int64_t exponent = b.AsInt();
      if (base == 0) return Value::Int(exponent == 0 ? 1 : 0);
      if (base == 1) return Value::Int(1);
      if (base == -1) return Value::Int(exponent % 2 == 0 ? 1 : -1);
      __int128 result = 1;
      for (int64_t i = 0; i < exponent; ++i) {  // |base| >= 2: overflows within 64 steps
        result = CheckedInt(result * base);
      }
      return Value::Int(CheckedInt(result));
    }
    double x = a.AsFloat();
    double y = b.AsFloat();
    if (x == 0.0 && y < 0) Fail("0.0 cannot be raised to a negative power");
    if (x < 0 && y != std::floor(y)) Fail("a negative number to a fractional power is complex");
    return Value::Float(std::pow(x, y));
  }
  Fail(StrCat("unknown operator ", op));
}

}  // namespace tandem::jinja
