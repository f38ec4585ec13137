#include "scheduler/fault_injection.h"

#include <stdexcept>

#include "absl/strings/numbers.h"
#include "common/strings.h"

namespace tandem::scheduler {

namespace {

// This Abseil's string_view may not be std::string_view.
absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

absl::StatusOr<FaultSpec> ParseFaultSpec(std::string_view text) {
  auto invalid = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        StrCat("--inject_fault='", text, "': ", why,
               " (expected LANE:KIND@STEP[:DURATION], e.g. prefill:error@3, decode:stall@2:3s)"));
  };
  FaultSpec spec;
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) return invalid("no lane");
  spec.lane = std::string(text.substr(0, colon));
  if (spec.lane != "prefill" && spec.lane != "decode" && spec.lane != "kv_transfer")
    return invalid("the lane is not prefill, decode or kv_transfer");
  std::string_view rest = text.substr(colon + 1);
  const size_t at = rest.find('@');
  if (at == std::string_view::npos) return invalid("no @STEP");
  const std::string_view kind = rest.substr(0, at);
  if (kind == "error") {
    spec.kind = FaultSpec::Kind::kError;
  } else if (kind == "throw") {
    spec.kind = FaultSpec::Kind::kThrow;
  } else if (kind == "stall") {
    spec.kind = FaultSpec::Kind::kStall;
  } else if (kind == "overread") {
    spec.kind = FaultSpec::Kind::kOverread;
  } else {
    return invalid("the kind is not error, throw, stall or overread");
  }
  rest = rest.substr(at + 1);
  const size_t duration_at = rest.find(':');
  if (!absl::SimpleAtoi(Absl(rest.substr(0, duration_at)), &spec.step) || spec.step < 1) {
    return invalid("STEP is not a step number >= 1");
  }
  if (spec.kind == FaultSpec::Kind::kStall) {
    if (duration_at == std::string_view::npos ||
        !absl::ParseDuration(Absl(rest.substr(duration_at + 1)), &spec.stall) ||
        spec.stall <= absl::ZeroDuration()) {
      return invalid("a stall needs a positive DURATION");
    }
  } else if (duration_at != std::string_view::npos) {
    return invalid("only a stall takes a DURATION");
  }
  return spec;
}

step::StepResult FaultInjectingWorker::Execute(const step::StepPlan& plan) {
  if (++steps_ == spec_.step) {
    switch (spec_.kind) {
      case FaultSpec::Kind::kError: {
        step::StepResult failed;
        failed.status = absl::InternalError(StrCat("injected fault: step ", spec_.step, " failed"));
        return failed;
      }
      case FaultSpec::Kind::kThrow:
        throw std::runtime_error(StrCat("injected fault: step ", spec_.step, " threw"));
      case FaultSpec::Kind::kStall:
        absl::SleepFor(spec_.stall);
        break;
      case FaultSpec::Kind::kOverread:
        break;  // a KV transfer's fault (refused for worker lanes)
    }
  }
  return inner_->Execute(plan);
}

}  // namespace tandem::scheduler
