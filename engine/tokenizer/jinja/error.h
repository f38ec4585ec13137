// Errors and resource limits inside the parser and the interpreter. Errors
// travel as a C++ exception (Error) inside this library only: jinja.cc catches
// every exception at the public API and turns it into an absl::Status.
#ifndef TANDEM_ENGINE_TOKENIZER_JINJA_ERROR_H_
#define TANDEM_ENGINE_TOKENIZER_JINJA_ERROR_H_

#include <cstddef>
#include <exception>
#include <string>
#include <utility>

#include "absl/status/status.h"

namespace tandem::jinja::internal {

class Error : public std::exception {
 public:
  Error(absl::StatusCode code, std::string message, int line = 0, bool bare = false)
      : code_(code), message_(std::move(message)), line_(line), bare_(bare) {}
  const char* what() const noexcept override { return message_.c_str(); }
  absl::StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The template line the error belongs to; 0 where not known yet.
  int line() const { return line_; }
  void set_line(int line) { line_ = line; }
  // raise_exception(): the message goes out exactly as the template wrote it.
  bool bare() const { return bare_; }

 private:
  absl::StatusCode code_;
  std::string message_;
  int line_;
  bool bare_;
};

// A template error (Python's TypeError, ValueError, UndefinedError, ...).
[[noreturn]] void Fail(std::string message);
// A limit of ours (recursion, output size, steps) was reached.
[[noreturn]] void FailLimit(std::string message);

// The limits that keep hostile templates and inputs from exhausting the stack,
// memory or time.
inline constexpr int kMaxNesting = 256;            // parser nesting, value nesting
inline constexpr int kMaxDepth = 600;              // interpreter recursion
inline constexpr size_t kMaxStackBytes = 2 << 20;  // stack the interpreter may use
inline constexpr size_t kMaxOutputBytes = 64 << 20;
inline constexpr size_t kMaxItems = 1'000'000;  // elements of one list
inline constexpr long kMaxRange = 100'000;      // jinja2's sandbox MAX_RANGE
inline constexpr long long kMaxSteps = 50'000'000;

// Measures the stack used since construction, so that deep recursion fails
// with an error instead of overflowing the thread's stack, whatever its size.
class StackGuard {
 public:
  StackGuard();
  // Fails when the stack in use exceeds the budget.
  void Check() const;

 private:
  const char* base_;
  size_t budget_;
};

}  // namespace tandem::jinja::internal

#endif  // TANDEM_ENGINE_TOKENIZER_JINJA_ERROR_H_
