// Scenarios of `tandem bench`: the four built-in product shapes, and
// scenario files (JSON) a user writes for their own.
#ifndef TANDEM_CLIENT_BENCH_SCENARIO_H_
#define TANDEM_CLIENT_BENCH_SCENARIO_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/bench/v1/bench.pb.h"

namespace tandem::bench {

// Names of the built-in scenarios: chat, long-context, coding-agent,
// coding-agent-edit, long-running, and crossover (the threshold sweep's load).
std::vector<std::string> BuiltinScenarioNames();

// A built-in scenario by name, else the JSON file at `name_or_path`. The
// result is validated (ValidateScenario).
absl::StatusOr<v1::Scenario> LoadScenario(const std::string& name_or_path);

// Parses a scenario from JSON text (unknown fields are errors) and validates it.
absl::StatusOr<v1::Scenario> ParseScenario(const std::string& json);

// Every class has a name, a positive median input and output length, a
// shared-prefix ratio in [0, 1], exactly one of concurrency and rate, and
// positive SLOs, a task of "" or "file-edit" (whose turns take no
// turn_input_tokens); at least one class is foreground. Errors name the field.
absl::Status ValidateScenario(const v1::Scenario& scenario);

}  // namespace tandem::bench

#endif  // TANDEM_CLIENT_BENCH_SCENARIO_H_
