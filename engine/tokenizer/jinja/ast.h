// The parsed template: expression and statement nodes, as jinja2's parser
// builds them.
#ifndef TANDEM_ENGINE_TOKENIZER_JINJA_AST_H_
#define TANDEM_ENGINE_TOKENIZER_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/jinja/value.h"

namespace tandem::jinja {

enum class ExprKind {
  kConst,
  kName,
  kList,
  kTuple,
  kDict,
  kGetAttr,
  kGetItem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kNot,
  kNeg,
  kPos,
  kBinary,  // + - * / // % ** and or
  kConcat,
  kCompare,
  kCond,
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Keyword {
  std::string name;
  ExprPtr value;
};

struct Arguments {
  std::vector<ExprPtr> args;
  std::vector<Keyword> kwargs;
  ExprPtr star_args;    // *args
  ExprPtr star_kwargs;  // **kwargs
};

struct Expr {
  Expr(ExprKind k, int l) : kind(k), line(l) {}
  ExprKind kind;
  int line;
  Value value;                 // kConst
  std::string name;            // kName; kGetAttr: attribute; kFilter, kTest; kBinary: operator
  std::vector<ExprPtr> items;  // kList, kTuple, kConcat; kDict: key, value, key, value...
  ExprPtr a;                   // operand / object / callee / test / first
  ExprPtr b;                   // kGetItem: index; kCond: value if true
  ExprPtr c;                   // kCond: value if false (may be null); kSlice: step
  Arguments call;              // kCall, kFilter, kTest
  // kCompare: the operators ("==", "in", "notin", ...) and their operands.
  std::vector<std::pair<std::string, ExprPtr>> ops;
  // kFilter: a filter of a {% filter %} block or {% set x | f %} (its input
  // comes from the block, not from `a`).
  bool block_input = false;
  // kFilter, kTest: jinja2 has no filter or test of this name. That is an
  // error when the template compiles, except inside an if statement or a
  // conditional expression, where it is one only if evaluated.
  bool unknown_name = false;
  // 1 + the height of the tallest child (the parser bounds it, so that
  // evaluating and freeing the tree never recurses too deeply).
  int height = 1;
};

// Targets of set, for and with.
struct Target {
  enum class Kind { kName, kTuple, kNamespaceAttr } kind = Kind::kName;
  std::string name;  // kName; kNamespaceAttr: the namespace variable
  std::string attr;  // kNamespaceAttr
  std::vector<Target> items;
  int line = 0;
};

enum class StmtKind {
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kGeneration,
  kWith,
  kBreak,
  kContinue,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null when required
};

struct Stmt {
  Stmt(StmtKind k, int l) : kind(k), line(l) {}
  StmtKind kind;
  int line;
  std::string text;  // kText; kMacro: name
  ExprPtr expr;      // kOutput, kSet value, kFor iterable, kCallBlock call, kFilterBlock filter
  ExprPtr filter;    // kFor: the `if` condition; kSetBlock: the filter (may be null)
  Target target;     // kSet, kSetBlock, kFor
  // kIf: the conditions of if and elif, each with its body.
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;  // kIf, kFor
  bool recursive = false;
  // kMacro, kCallBlock: the parameters, and which special names the body uses.
  std::vector<MacroParam> params;
  bool uses_varargs = false;
  bool uses_kwargs = false;
  bool uses_caller = false;
  // kWith: targets and values.
  std::vector<std::pair<Target, ExprPtr>> assignments;
};

struct Program {
  Body body;
};

}  // namespace tandem::jinja

#endif  // TANDEM_ENGINE_TOKENIZER_JINJA_AST_H_
