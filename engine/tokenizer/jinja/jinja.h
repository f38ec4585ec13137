// A Jinja2 template interpreter of our own, for the chat templates in GGUF
// model files: it renders them as Hugging Face transformers does
// (transformers.utils.chat_template_utils.render_jinja_template: jinja2's
// ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
// loopcontrols extension and {% generation %} blocks, transformers' tojson
// filter and its raise_exception and strftime_now globals).
//
// Values follow Python: None prints "None", floats print as Python's repr,
// lists and dicts as Python's repr, strings are sequences of code points, and
// undefined variables are jinja2's Undefined (falsy, empty when printed or
// iterated, an error when used otherwise).
//
// Thread safety: a Template is immutable after Parse; Render may run
// concurrently on one Template. Neither throws: errors are statuses, and
// limits on recursion, output and work make hostile templates fail cleanly.
#ifndef TANDEM_ENGINE_TOKENIZER_JINJA_JINJA_H_
#define TANDEM_ENGINE_TOKENIZER_JINJA_JINJA_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace tandem::jinja {

struct Program;

struct RenderOptions {
  // What strftime_now() formats (in the local time zone, as Python's
  // datetime.now() does).
  absl::Time now = absl::Now();
};

class Template {
 public:
  // Parse errors are INVALID_ARGUMENT naming the construct and line, e.g.
  // "line 12: unknown filter 'foo'", "line 3: unsupported statement 'include'".
  static absl::StatusOr<Template> Parse(std::string_view source);

  // context: the variables (messages, tools, add_generation_prompt,
  // bos_token, ...), a JSON object. raise_exception("msg") in the template
  // gives an INVALID_ARGUMENT status whose message is msg; other template
  // errors are INVALID_ARGUMENT with the line ("line 4: 'x' is undefined"),
  // exceeded limits RESOURCE_EXHAUSTED.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context,
                                     const RenderOptions& options = {}) const;

 private:
  explicit Template(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace tandem::jinja

#endif  // TANDEM_ENGINE_TOKENIZER_JINJA_JINJA_H_
