// Runs a parsed template over the variables of one render, with jinja2's
// scoping: a for loop's body, a macro call and the bodies of set, filter,
// generation and with blocks get their own scope over the enclosing one
// (reading falls through to it, setting stays inside); if does not.
#ifndef TANDEM_ENGINE_TOKENIZER_JINJA_INTERPRETER_H_
#define TANDEM_ENGINE_TOKENIZER_JINJA_INTERPRETER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "engine/tokenizer/jinja/ast.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/value.h"
#include "nlohmann/json.hpp"

namespace tandem::jinja {

struct Frame {
  explicit Frame(std::shared_ptr<Frame> p) : parent(std::move(p)) {}
  std::shared_ptr<Frame> parent;
  absl::flat_hash_map<std::string, Value> vars;
};
using FramePtr = std::shared_ptr<Frame>;

class Interpreter {
 public:
  // `context` must be a JSON object: its members are the template variables.
  Interpreter(const Program& program, const nlohmann::ordered_json& context, absl::Time now);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Fails (internal::Error) as the template does.
  std::string Render();

  // For the built-ins.
  Value CallValue(const Value& callee, CallArgs args);
  absl::Time now() const { return now_; }
  // Namespaces can reference themselves; the interpreter breaks such cycles
  // when it ends.
  void Track(std::shared_ptr<NamespaceObject> ns) { namespaces_.push_back(std::move(ns)); }
  // Counts work against the step limit (one step: one node evaluated, one
  // loop iteration, or one item a built-in goes through).
  void Step(long long n = 1) {
    steps_ += n;
    if (steps_ > internal::kMaxSteps) internal::FailLimit("template evaluation too long");
  }

  // Macros, call blocks and recursive loops.
  Value CallMacro(const Stmt& stmt, const std::string& name, const FramePtr& closure,
                  CallArgs args);
  Value RunRecursiveLoop(const Stmt& stmt, const FramePtr& frame, const Value& iterable, int depth);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  class DepthGuard;

  Flow Exec(const Body& body, const FramePtr& frame, std::string* out);
  Flow ExecStmt(const Stmt& stmt, const FramePtr& frame, std::string* out);
  void ExecFor(const Stmt& stmt, const FramePtr& frame, const Value& iterable, int depth,
               std::string* out);
  std::string ExecBlockBody(const Body& body, const FramePtr& frame);
  void Assign(const Target& target, Value value, const FramePtr& frame);
  void Emit(std::string_view text, std::string* out);

  Value Eval(const Expr& e, const FramePtr& frame);
  Value EvalCall(const Expr& e, const FramePtr& frame);
  CallArgs EvalArgs(const Arguments& args, const FramePtr& frame);
  Value Lookup(const std::string& name, const FramePtr& frame);
  Value Arith(const std::string& op, const Value& a, const Value& b);
  bool CompareOp(const std::string& op, const Value& a, const Value& b);

  const Program& program_;
  absl::Time now_;
  FramePtr context_frame_;
  FramePtr root_;
  const Value* block_input_ = nullptr;  // the input of a {% filter %} block's filters
  int depth_ = 0;
  long long steps_ = 0;
  internal::StackGuard stack_;
  // Scopes that macros captured, and namespaces: cleared at the end so that
  // reference cycles through them are freed.
  std::vector<FramePtr> closures_;
  std::vector<std::shared_ptr<NamespaceObject>> namespaces_;
};

}  // namespace tandem::jinja

#endif  // TANDEM_ENGINE_TOKENIZER_JINJA_INTERPRETER_H_
