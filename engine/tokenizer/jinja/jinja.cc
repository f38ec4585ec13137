#include "engine/tokenizer/jinja/jinja.h"

#include <exception>
#include <new>

#include "common/strings.h"
#include "engine/tokenizer/jinja/ast.h"
#include "engine/tokenizer/jinja/error.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/jinja/parser.h"

namespace tandem::jinja {
namespace {

absl::Status ToStatus(const internal::Error& e) {
  if (e.bare() || e.line() == 0) return absl::Status(e.code(), e.message());
  return absl::Status(e.code(), StrCat("line ", e.line(), ": ", e.message()));
}

}  // namespace

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  try {
    std::shared_ptr<const Program> program = ParseProgram(source);
    return Template(std::move(program));
  } catch (const internal::Error& e) {
    return ToStatus(e);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory parsing the template");
  } catch (const std::exception& e) {
    return absl::InternalError(StrCat("parsing the template: ", e.what()));
  } catch (...) {
    return absl::InternalError("parsing the template: unknown error");
  }
}

absl::StatusOr<std::string> Template::Render(const nlohmann::ordered_json& context,
                                             const RenderOptions& options) const {
  try {
    Interpreter interpreter(*program_, context, options.now);
    return interpreter.Render();
  } catch (const internal::Error& e) {
    return ToStatus(e);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory rendering the template");
  } catch (const std::exception& e) {
    return absl::InternalError(StrCat("rendering the template: ", e.what()));
  } catch (...) {
    return absl::InternalError("rendering the template: unknown error");
  }
}

}  // namespace tandem::jinja
