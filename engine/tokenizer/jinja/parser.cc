#include "engine/tokenizer/jinja/parser.h"

#include <algorithm>
#include <initializer_list>

#include "common/strings.h"
#include "engine/tokenizer/jinja/builtins.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/lexer.h"

namespace tandem::jinja {
namespace {

using internal::Error;

std::string Describe(const Token& t) {
  switch (t.type) {
    case TokenType::kData:
      return "template data";
    case TokenType::kVariableBegin:
      return "begin of print statement";
    case TokenType::kVariableEnd:
      return "end of print statement";
    case TokenType::kBlockBegin:
      return "begin of statement block";
    case TokenType::kBlockEnd:
      return "end of statement block";
    case TokenType::kEof:
      return "end of template";
    case TokenType::kString:
      return "string";
    case TokenType::kInteger:
      return "integer";
    case TokenType::kFloat:
      return "float";
    default:
      return t.value;
  }
}

// Whether an expression or statement tree reads the variable `name`.
bool ReadsName(const Expr* e, std::string_view name);
bool ReadsName(const Body& body, std::string_view name);

bool ReadsArgs(const Arguments& args, std::string_view name) {
  for (const auto& a : args.args) {
    if (ReadsName(a.get(), name)) return true;
  }
  for (const auto& k : args.kwargs) {
    if (ReadsName(k.value.get(), name)) return true;
  }
  return ReadsName(args.star_args.get(), name) || ReadsName(args.star_kwargs.get(), name);
}

bool ReadsName(const Expr* e, std::string_view name) {
  if (e == nullptr) return false;
  if (e->kind == ExprKind::kName && e->name == name) return true;
  for (const auto& i : e->items) {
    if (ReadsName(i.get(), name)) return true;
  }
  for (const auto& [op, operand] : e->ops) {
    if (ReadsName(operand.get(), name)) return true;
  }
  return ReadsName(e->a.get(), name) || ReadsName(e->b.get(), name) ||
         ReadsName(e->c.get(), name) || ReadsArgs(e->call, name);
}

bool ReadsName(const Body& body, std::string_view name) {
  for (const auto& s : body) {
    if (ReadsName(s->expr.get(), name) || ReadsName(s->filter.get(), name) ||
        ReadsName(s->body, name) || ReadsName(s->else_body, name)) {
      return true;
    }
    for (const auto& [cond, b] : s->branches) {
      if (ReadsName(cond.get(), name) || ReadsName(b, name)) return true;
    }
    for (const auto& p : s->params) {
      if (ReadsName(p.default_value.get(), name)) return true;
    }
    for (const auto& [t, v] : s->assignments) {
      if (ReadsName(v.get(), name)) return true;
    }
  }
  return false;
}

// Fails on the first filter or test jinja2 does not know outside a "soft"
// context (an if statement's conditions and bodies, a conditional
// expression), as jinja2's compiler does; inside one the name fails only if
// evaluated.
void CheckNames(const Expr* e, bool soft);

void CheckNames(const Arguments& args, bool soft) {
  for (const auto& a : args.args) CheckNames(a.get(), soft);
  for (const auto& k : args.kwargs) CheckNames(k.value.get(), soft);
  CheckNames(args.star_args.get(), soft);
  CheckNames(args.star_kwargs.get(), soft);
}

void CheckNames(const Expr* e, bool soft) {
  if (e == nullptr) return;
  if (e->kind == ExprKind::kCond) soft = true;
  // The operand comes first in the source.
  CheckNames(e->a.get(), soft);
  if (e->unknown_name && !soft) {
    throw Error(
        absl::StatusCode::kInvalidArgument,
        StrCat("unknown ", e->kind == ExprKind::kFilter ? "filter" : "test", " '", e->name, "'"),
        e->line);
  }
  CheckNames(e->b.get(), soft);
  CheckNames(e->c.get(), soft);
  for (const auto& i : e->items) CheckNames(i.get(), soft);
  for (const auto& [op, operand] : e->ops) CheckNames(operand.get(), soft);
  CheckNames(e->call, soft);
}

void CheckNames(const Body& body, bool soft) {
  for (const auto& s : body) {
    switch (s->kind) {
      case StmtKind::kIf:
        for (const auto& [cond, b] : s->branches) {
          CheckNames(cond.get(), true);
          CheckNames(b, true);
        }
        CheckNames(s->else_body, true);
        break;
      case StmtKind::kFor:
        CheckNames(s->expr.get(), soft);
        CheckNames(s->filter.get(), false);
        CheckNames(s->body, false);
        CheckNames(s->else_body, false);
        break;
      case StmtKind::kOutput:
      case StmtKind::kSet:
      case StmtKind::kCallBlock:
        CheckNames(s->expr.get(), soft);
        CheckNames(s->body, false);
        break;
      case StmtKind::kWith:
        for (const auto& [t, v] : s->assignments) CheckNames(v.get(), soft);
        CheckNames(s->body, false);
        break;
      default:
        for (const auto& p : s->params) CheckNames(p.default_value.get(), false);
        CheckNames(s->body, false);
        CheckNames(s->filter.get(), false);
        CheckNames(s->expr.get(), false);
        break;
    }
  }
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  std::unique_ptr<Program> Run() {
    auto program = std::make_unique<Program>();
    program->body = Subparse({});
    if (Current().type != TokenType::kEof) FailHere(StrCat("unexpected ", Describe(Current())));
    CheckNames(program->body, false);
    return program;
  }

 private:
  // ---- token stream ----
  const Token& Current() const { return tokens_[pos_]; }
  const Token& Look() const {
    return tokens_[pos_ + 1 < tokens_.size() ? pos_ + 1 : tokens_.size() - 1];
  }
  const Token& Next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  [[noreturn]] void Fail(int line, std::string message) const {
    throw Error(absl::StatusCode::kInvalidArgument, std::move(message), line);
  }
  [[noreturn]] void FailHere(std::string message) const { Fail(Current().line, message); }
  bool SkipOp(std::string_view op) {
    if (!Current().IsOp(op)) return false;
    Next();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!Current().IsName(name)) return false;
    Next();
    return true;
  }
  const Token& ExpectOp(std::string_view op) {
    if (!Current().IsOp(op)) {
      FailHere(StrCat("expected '", op, "', got ", Quoted(Current())));
    }
    return Next();
  }
  const Token& ExpectName() {
    if (Current().type != TokenType::kName)
      FailHere(StrCat("expected name, got ", Quoted(Current())));
    return Next();
  }
  const Token& ExpectNameValue(std::string_view name) {
    if (!Current().IsName(name)) FailHere(StrCat("expected '", name, "', got ", Quoted(Current())));
    return Next();
  }
  void ExpectType(TokenType type, std::string_view what) {
    if (Current().type != type) FailHere(StrCat("expected ", what, ", got ", Quoted(Current())));
    Next();
  }
  static std::string Quoted(const Token& t) { return StrCat("'", Describe(t), "'"); }

  // Nesting guard: deep nesting fails instead of exhausting the stack.
  struct Nest {
    explicit Nest(Parser* p) : parser(p) {
      if (++parser->depth_ > internal::kMaxNesting) {
        throw Error(absl::StatusCode::kResourceExhausted, "template nesting too deep",
                    parser->Current().line);
      }
      parser->stack_.Check();
    }
    ~Nest() { --parser->depth_; }
    Parser* parser;
  };

  ExprPtr Make(ExprKind kind, int line) { return std::make_unique<Expr>(kind, line); }

  // Sets e's height from its children; fails when the tree gets too tall
  // (long chains like a|f|f|f... or a+a+a+... build deep trees without deep
  // parser recursion).
  ExprPtr Seal(ExprPtr e) {
    int h = 0;
    auto see = [&h](const ExprPtr& child) {
      if (child != nullptr) h = std::max(h, child->height);
    };
    see(e->a);
    see(e->b);
    see(e->c);
    for (const auto& i : e->items) see(i);
    for (const auto& [op, operand] : e->ops) see(operand);
    for (const auto& arg : e->call.args) see(arg);
    for (const auto& k : e->call.kwargs) see(k.value);
    see(e->call.star_args);
    see(e->call.star_kwargs);
    e->height = h + 1;
    if (e->height > internal::kMaxNesting) {
      throw Error(absl::StatusCode::kResourceExhausted, "expression nesting too deep", e->line);
    }
    return e;
  }

  // ---- statements ----
  bool AtEnd(std::initializer_list<std::string_view> end_tokens) const {
    if (Current().type != TokenType::kName) return false;
    for (std::string_view e : end_tokens) {
      if (Current().value == e) return true;
    }
    return false;
  }

  // Statements until a {% tag %} whose name is in end_tokens; leaves the
  // stream at that name.
  Body Subparse(std::initializer_list<std::string_view> end_tokens) {
    Nest nest(this);
    Body body;
    while (Current().type != TokenType::kEof) {
      const Token& t = Current();
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>(StmtKind::kText, t.line);
        s->text = t.value;
        body.push_back(std::move(s));
        Next();
      } else if (t.type == TokenType::kVariableBegin) {
        Next();
        auto s = std::make_unique<Stmt>(StmtKind::kOutput, Current().line);
        s->expr = ParseTuple(false, true, {}, false);
        ExpectType(TokenType::kVariableEnd, "end of print statement");
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        Next();
        if (end_tokens.size() > 0 && AtEnd(end_tokens)) return body;
        body.push_back(ParseStatement());
        ExpectType(TokenType::kBlockEnd, "end of statement block");
      } else {
        FailHere(StrCat("unexpected ", Describe(t)));
      }
    }
    if (end_tokens.size() > 0) {
      std::string names;
      for (std::string_view e : end_tokens)
        names += StrCat(names.empty() ? "" : " or ", "'", e, "'");
      FailHere(StrCat("unexpected end of template, expected ", names));
    }
    return body;
  }

  // Expects %}, the body, then one of the end tags (which stays current).
  Body ParseStatements(std::initializer_list<std::string_view> end_tokens, bool drop_needle) {
    ExpectType(TokenType::kBlockEnd, "end of statement block");
    Body body = Subparse(end_tokens);
    if (drop_needle) Next();
    return body;
  }

  StmtPtr ParseStatement() {
    const Token& t = Current();
    if (t.type != TokenType::kName) FailHere("tag name expected");
    const std::string name = t.value;
    int line = t.line;
    if (name == "for") return ParseFor();
    if (name == "if") return ParseIf();
    if (name == "set") return ParseSet();
    if (name == "macro") return ParseMacro();
    if (name == "call") return ParseCallBlock();
    if (name == "filter") return ParseFilterBlock();
    if (name == "with") return ParseWith();
    if (name == "generation") {
      Next();
      auto s = std::make_unique<Stmt>(StmtKind::kGeneration, line);
      int saved = loop_depth_;
      loop_depth_ = 0;  // the body is a nested function in jinja2
      s->body = ParseStatements({"endgeneration"}, true);
      loop_depth_ = saved;
      return s;
    }
    if (name == "print") {
      Next();
      auto s = std::make_unique<Stmt>(StmtKind::kOutput, line);
      s->expr = ParseTuple(false, true, {}, false);
      return s;
    }
    if (name == "break" || name == "continue") {
      Next();
      if (loop_depth_ == 0) Fail(line, StrCat("'", name, "' outside loop"));
      return std::make_unique<Stmt>(name == "break" ? StmtKind::kBreak : StmtKind::kContinue, line);
    }
    if (name == "include" || name == "import" || name == "from" || name == "extends" ||
        name == "block" || name == "autoescape") {
      Fail(line, StrCat("unsupported statement '", name, "'"));
    }
    Fail(line, StrCat("unknown statement '", name, "'"));
  }

  StmtPtr ParseFor() {
    auto s = std::make_unique<Stmt>(StmtKind::kFor, Next().line);
    s->target = ParseAssignTarget(false, {"in"});
    ExpectNameValue("in");
    s->expr = ParseTuple(false, false, {"recursive"}, false);
    if (SkipName("if")) s->filter = ParseExpression(true);
    s->recursive = SkipName("recursive");
    ++loop_depth_;
    s->body = ParseStatements({"endfor", "else"}, false);
    --loop_depth_;
    if (Next().value == "else") s->else_body = ParseStatements({"endfor"}, true);
    return s;
  }

  StmtPtr ParseIf() {
    auto s = std::make_unique<Stmt>(StmtKind::kIf, Next().line);
    while (true) {
      ExprPtr cond = ParseTuple(false, false, {}, false);
      Body body = ParseStatements({"elif", "else", "endif"}, false);
      s->branches.emplace_back(std::move(cond), std::move(body));
      const Token& t = Next();
      if (t.value == "elif") continue;
      if (t.value == "else") s->else_body = ParseStatements({"endif"}, true);
      break;
    }
    return s;
  }

  StmtPtr ParseSet() {
    int line = Next().line;
    Target target = ParseAssignTarget(true, {});
    if (SkipOp("=")) {
      auto s = std::make_unique<Stmt>(StmtKind::kSet, line);
      s->target = std::move(target);
      s->expr = ParseTuple(false, true, {}, false);
      return s;
    }
    auto s = std::make_unique<Stmt>(StmtKind::kSetBlock, line);
    s->target = std::move(target);
    if (Current().IsOp("|")) s->filter = ParseFilter(nullptr, false);
    s->body = ParseStatements({"endset"}, true);
    return s;
  }

  StmtPtr ParseMacro() {
    auto s = std::make_unique<Stmt>(StmtKind::kMacro, Next().line);
    s->text = ExpectName().value;
    ParseSignature(s.get());
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = ParseStatements({"endmacro"}, true);
    loop_depth_ = saved;
    SetSpecialNames(s.get());
    return s;
  }

  void SetSpecialNames(Stmt* s) {
    s->uses_varargs = ReadsName(s->body, "varargs");
    s->uses_kwargs = ReadsName(s->body, "kwargs");
    s->uses_caller = ReadsName(s->body, "caller");
  }

  void ParseSignature(Stmt* s) {
    ExpectOp("(");
    bool defaults = false;
    while (!Current().IsOp(")")) {
      if (!s->params.empty()) ExpectOp(",");
      MacroParam p;
      p.name = ExpectName().value;
      if (SkipOp("=")) {
        p.default_value = ParseExpression(true);
        defaults = true;
      } else if (defaults) {
        FailHere("non-default argument follows default argument");
      }
      s->params.push_back(std::move(p));
    }
    ExpectOp(")");
  }

  StmtPtr ParseCallBlock() {
    auto s = std::make_unique<Stmt>(StmtKind::kCallBlock, Next().line);
    if (Current().IsOp("(")) ParseSignature(s.get());
    s->expr = ParseExpression(true);
    if (s->expr->kind != ExprKind::kCall) Fail(s->line, "expected call");
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = ParseStatements({"endcall"}, true);
    loop_depth_ = saved;
    SetSpecialNames(s.get());
    return s;
  }

  StmtPtr ParseFilterBlock() {
    auto s = std::make_unique<Stmt>(StmtKind::kFilterBlock, Next().line);
    s->expr = ParseFilter(nullptr, true);
    s->body = ParseStatements({"endfilter"}, true);
    return s;
  }

  StmtPtr ParseWith() {
    auto s = std::make_unique<Stmt>(StmtKind::kWith, Next().line);
    while (Current().type != TokenType::kBlockEnd) {
      if (!s->assignments.empty()) ExpectOp(",");
      Target t = ParseAssignTarget(false, {});
      ExpectOp("=");
      s->assignments.emplace_back(std::move(t), ParseExpression(true));
    }
    s->body = ParseStatements({"endwith"}, true);
    return s;
  }

  // A name, a tuple of names (nested in parentheses), or with_namespace a
  // namespace attribute `ns.attr`.
  Target ParseAssignTarget(bool with_namespace, std::initializer_list<std::string_view> extra_end) {
    int line = Current().line;
    if (with_namespace && Current().type == TokenType::kName && Look().IsOp(".")) {
      Target t;
      t.kind = Target::Kind::kNamespaceAttr;
      t.line = line;
      t.name = Next().value;
      Next();  // .
      t.attr = ExpectName().value;
      return t;
    }
    ExprPtr e = ParseTuple(true, true, extra_end, false);
    return ToTarget(*e);
  }

  Target ToTarget(const Expr& e) {
    Target t;
    t.line = e.line;
    if (e.kind == ExprKind::kName) {
      t.name = e.name;
      if (t.name == "true" || t.name == "false" || t.name == "none") {
        Fail(e.line, "can't assign to 'const'");
      }
      return t;
    }
    if (e.kind == ExprKind::kTuple) {
      t.kind = Target::Kind::kTuple;
      for (const auto& item : e.items) t.items.push_back(ToTarget(*item));
      return t;
    }
    Fail(e.line, "can't assign to this expression");
  }

  // ---- expressions ----
  bool IsTupleEnd(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = Current();
    if (t.type == TokenType::kVariableEnd || t.type == TokenType::kBlockEnd || t.IsOp(")")) {
      return true;
    }
    for (std::string_view e : extra_end) {
      if (t.IsName(e)) return true;
    }
    return false;
  }

  ExprPtr ParseTuple(bool simplified, bool with_condexpr,
                     std::initializer_list<std::string_view> extra_end, bool explicit_parens) {
    int line = Current().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) ExpectOp(",");
      if (IsTupleEnd(extra_end)) break;
      if (simplified) {
        args.push_back(ParsePrimary());
      } else {
        args.push_back(ParseExpression(with_condexpr));
      }
      if (Current().IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) FailHere(StrCat("expected an expression, got ", Quoted(Current())));
    }
    ExprPtr t = Make(ExprKind::kTuple, line);
    t->items = std::move(args);
    return Seal(std::move(t));
  }

  ExprPtr ParseExpression(bool with_condexpr) {
    Nest nest(this);
    return with_condexpr ? ParseCondExpr() : ParseOr();
  }

  ExprPtr ParseCondExpr() {
    int line = Current().line;
    ExprPtr expr1 = ParseOr();
    while (SkipName("if")) {
      ExprPtr expr2 = ParseOr();
      ExprPtr expr3;
      if (SkipName("else")) expr3 = ParseCondExpr();
      ExprPtr cond = Make(ExprKind::kCond, line);
      cond->a = std::move(expr2);
      cond->b = std::move(expr1);
      cond->c = std::move(expr3);
      expr1 = Seal(std::move(cond));
      line = Current().line;
    }
    return expr1;
  }

  ExprPtr Binary(std::string op, ExprPtr left, ExprPtr right, int line) {
    ExprPtr e = Make(ExprKind::kBinary, line);
    e->name = std::move(op);
    e->a = std::move(left);
    e->b = std::move(right);
    return Seal(std::move(e));
  }

  ExprPtr ParseOr() {
    int line = Current().line;
    ExprPtr left = ParseAnd();
    while (SkipName("or")) {
      left = Binary("or", std::move(left), ParseAnd(), line);
      line = Current().line;
    }
    return left;
  }

  ExprPtr ParseAnd() {
    int line = Current().line;
    ExprPtr left = ParseNot();
    while (SkipName("and")) {
      left = Binary("and", std::move(left), ParseNot(), line);
      line = Current().line;
    }
    return left;
  }

  ExprPtr ParseNot() {
    Nest nest(this);
    if (Current().IsName("not")) {
      int line = Next().line;
      ExprPtr e = Make(ExprKind::kNot, line);
      e->a = ParseNot();
      return Seal(std::move(e));
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    int line = Current().line;
    ExprPtr expr = ParseMath1();
    std::vector<std::pair<std::string, ExprPtr>> ops;
    while (true) {
      const Token& t = Current();
      if (t.type == TokenType::kOperator &&
          (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == "<=" ||
           t.value == ">" || t.value == ">=")) {
        std::string op = Next().value;
        ops.emplace_back(op, ParseMath1());
      } else if (SkipName("in")) {
        ops.emplace_back("in", ParseMath1());
      } else if (t.IsName("not") && Look().IsName("in")) {
        Next();
        Next();
        ops.emplace_back("notin", ParseMath1());
      } else {
        break;
      }
      line = Current().line;
    }
    if (ops.empty()) return expr;
    ExprPtr e = Make(ExprKind::kCompare, line);
    e->a = std::move(expr);
    e->ops = std::move(ops);
    return Seal(std::move(e));
  }

  ExprPtr ParseMath1() {
    int line = Current().line;
    ExprPtr left = ParseConcat();
    while (Current().IsOp("+") || Current().IsOp("-")) {
      std::string op = Next().value;
      left = Binary(op, std::move(left), ParseConcat(), line);
      line = Current().line;
    }
    return left;
  }

  ExprPtr ParseConcat() {
    int line = Current().line;
    std::vector<ExprPtr> args;
    args.push_back(ParseMath2());
    while (SkipOp("~")) args.push_back(ParseMath2());
    if (args.size() == 1) return std::move(args[0]);
    ExprPtr e = Make(ExprKind::kConcat, line);
    e->items = std::move(args);
    return Seal(std::move(e));
  }

  ExprPtr ParseMath2() {
    int line = Current().line;
    ExprPtr left = ParsePow();
    while (Current().IsOp("*") || Current().IsOp("/") || Current().IsOp("//") ||
           Current().IsOp("%")) {
      std::string op = Next().value;
      left = Binary(op, std::move(left), ParsePow(), line);
      line = Current().line;
    }
    return left;
  }

  ExprPtr ParsePow() {
    int line = Current().line;
    ExprPtr left = ParseUnary(true);
    while (SkipOp("**")) {
      left = Binary("**", std::move(left), ParseUnary(true), line);
      line = Current().line;
    }
    return left;
  }

  ExprPtr ParseUnary(bool with_filter) {
    Nest nest(this);
    int line = Current().line;
    ExprPtr node;
    if (SkipOp("-")) {
      node = Make(ExprKind::kNeg, line);
      node->a = ParseUnary(false);
    } else if (SkipOp("+")) {
      node = Make(ExprKind::kPos, line);
      node->a = ParseUnary(false);
    } else {
      node = ParsePrimary();
    }
    node = ParsePostfix(Seal(std::move(node)));
    if (with_filter) node = ParseFilterExpr(std::move(node));
    return node;
  }

  ExprPtr ParsePrimary() {
    Nest nest(this);
    const Token& t = Current();
    int line = t.line;
    if (t.type == TokenType::kName) {
      ExprPtr e = Make(ExprKind::kConst, line);
      if (t.value == "true" || t.value == "True") {
        e->value = Value::Bool(true);
      } else if (t.value == "false" || t.value == "False") {
        e->value = Value::Bool(false);
      } else if (t.value == "none" || t.value == "None") {
        e->value = Value::None();
      } else {
        e = Make(ExprKind::kName, line);
        e->name = t.value;
      }
      Next();
      return e;
    }
    if (t.type == TokenType::kString) {
      std::string s;
      while (Current().type == TokenType::kString) s += Next().value;
      ExprPtr e = Make(ExprKind::kConst, line);
      e->value = Value::String(std::move(s));
      return e;
    }
    if (t.type == TokenType::kInteger || t.type == TokenType::kFloat) {
      ExprPtr e = Make(ExprKind::kConst, line);
      e->value =
          t.type == TokenType::kInteger ? Value::Int(t.int_value) : Value::Float(t.float_value);
      Next();
      return e;
    }
    if (SkipOp("(")) {
      ExprPtr e = ParseTuple(false, true, {}, true);
      ExpectOp(")");
      return e;
    }
    if (SkipOp("[")) {
      ExprPtr e = Make(ExprKind::kList, line);
      while (!Current().IsOp("]")) {
        if (!e->items.empty()) ExpectOp(",");
        if (Current().IsOp("]")) break;
        e->items.push_back(ParseExpression(true));
      }
      ExpectOp("]");
      return Seal(std::move(e));
    }
    if (SkipOp("{")) {
      ExprPtr e = Make(ExprKind::kDict, line);
      while (!Current().IsOp("}")) {
        if (!e->items.empty()) ExpectOp(",");
        if (Current().IsOp("}")) break;
        e->items.push_back(ParseExpression(true));
        ExpectOp(":");
        e->items.push_back(ParseExpression(true));
      }
      ExpectOp("}");
      return Seal(std::move(e));
    }
    FailHere(StrCat("unexpected ", Quoted(t)));
  }

  ExprPtr ParsePostfix(ExprPtr node) {
    while (true) {
      if (Current().IsOp(".") || Current().IsOp("[")) {
        node = Seal(ParseSubscript(std::move(node)));
      } else if (Current().IsOp("(")) {
        node = Seal(ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (Current().IsOp("|")) {
        node = ParseFilter(std::move(node), false);
      } else if (Current().IsName("is")) {
        node = Seal(ParseTest(std::move(node)));
      } else if (Current().IsOp("(")) {
        node = Seal(ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr node) {
    const Token& t = Next();
    int line = t.line;
    if (t.IsOp(".")) {
      const Token& attr = Next();
      if (attr.type == TokenType::kName) {
        ExprPtr e = Make(ExprKind::kGetAttr, line);
        e->a = std::move(node);
        e->name = attr.value;
        return e;
      }
      if (attr.type != TokenType::kInteger) Fail(attr.line, "expected name or number");
      ExprPtr index = Make(ExprKind::kConst, attr.line);
      index->value = Value::Int(attr.int_value);
      ExprPtr e = Make(ExprKind::kGetItem, line);
      e->a = std::move(node);
      e->b = std::move(index);
      return e;
    }
    std::vector<ExprPtr> args;
    while (!Current().IsOp("]")) {
      if (!args.empty()) ExpectOp(",");
      args.push_back(ParseSubscribed());
    }
    ExpectOp("]");
    ExprPtr e = Make(ExprKind::kGetItem, line);
    e->a = std::move(node);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      e->b = Make(ExprKind::kTuple, line);
      e->b->items = std::move(args);
    }
    return e;
  }

  ExprPtr ParseSubscribed() {
    int line = Current().line;
    ExprPtr start;
    if (!SkipOp(":")) {
      ExprPtr node = ParseExpression(true);
      if (!Current().IsOp(":")) return node;
      Next();
      start = std::move(node);
    }
    ExprPtr e = Make(ExprKind::kSlice, line);
    e->a = std::move(start);
    if (!Current().IsOp(":") && !Current().IsOp("]") && !Current().IsOp(",")) {
      e->b = ParseExpression(true);
    }
    if (SkipOp(":")) {
      if (!Current().IsOp("]") && !Current().IsOp(",")) e->c = ParseExpression(true);
    }
    return e;
  }

  Arguments ParseCallArgs() {
    int line = ExpectOp("(").line;
    Arguments args;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) Fail(line, "invalid syntax for function call expression");
    };
    while (!Current().IsOp(")")) {
      if (require_comma) {
        ExpectOp(",");
        if (Current().IsOp(")")) break;
      }
      if (SkipOp("*")) {
        ensure(args.star_args == nullptr && args.star_kwargs == nullptr);
        args.star_args = ParseExpression(true);
      } else if (SkipOp("**")) {
        ensure(args.star_kwargs == nullptr);
        args.star_kwargs = ParseExpression(true);
      } else if (Current().type == TokenType::kName && Look().IsOp("=")) {
        ensure(args.star_kwargs == nullptr);
        std::string key = Next().value;
        Next();
        args.kwargs.push_back(Keyword{key, ParseExpression(true)});
      } else {
        ensure(args.star_args == nullptr && args.star_kwargs == nullptr && args.kwargs.empty());
        args.args.push_back(ParseExpression(true));
      }
      require_comma = true;
    }
    ExpectOp(")");
    return args;
  }

  ExprPtr ParseCall(ExprPtr node) {
    ExprPtr e = Make(ExprKind::kCall, Current().line);
    e->a = std::move(node);
    e->call = ParseCallArgs();
    return e;
  }

  std::string DottedName() {
    std::string name = ExpectName().value;
    while (Current().IsOp(".")) {
      Next();
      absl::StrAppend(&name, ".", ExpectName().value);
    }
    return name;
  }

  // node|f|g(args)...; node null: the input of a filter block.
  ExprPtr ParseFilter(ExprPtr node, bool start_inline) {
    bool block_input = node == nullptr;
    while (Current().IsOp("|") || start_inline) {
      if (!start_inline) Next();
      int line = Current().line;
      std::string name = DottedName();
      ExprPtr e = Make(ExprKind::kFilter, line);
      e->name = name;
      e->unknown_name = FilterAvailability(name) == Availability::kUnknown;
      e->a = std::move(node);
      e->block_input = block_input && e->a == nullptr;
      if (Current().IsOp("(")) e->call = ParseCallArgs();
      node = Seal(std::move(e));
      start_inline = false;
    }
    return node;
  }

  ExprPtr ParseTest(ExprPtr node) {
    int line = Next().line;  // is
    bool negated = SkipName("not");
    int name_line = Current().line;
    std::string name = DottedName();
    ExprPtr e = Make(ExprKind::kTest, name_line);
    e->name = name;
    e->unknown_name = TestAvailability(name) == Availability::kUnknown;
    e->a = std::move(node);
    const Token& t = Current();
    if (t.IsOp("(")) {
      e->call = ParseCallArgs();
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString ||
                t.type == TokenType::kInteger || t.type == TokenType::kFloat || t.IsOp("(") ||
                t.IsOp("[") || t.IsOp("{")) &&
               !t.IsName("else") && !t.IsName("or") && !t.IsName("and")) {
      if (t.IsName("is")) FailHere("You cannot chain multiple tests with is");
      ExprPtr arg = ParsePostfix(ParsePrimary());
      e->call.args.push_back(std::move(arg));
    }
    if (!negated) return e;
    ExprPtr n = Make(ExprKind::kNot, line);
    n->a = std::move(e);
    return Seal(std::move(n));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  internal::StackGuard stack_;
};

}  // namespace

std::unique_ptr<Program> ParseProgram(std::string_view source) {
  return Parser(Tokenize(source)).Run();
}

}  // namespace tandem::jinja
