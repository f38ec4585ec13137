#include "client/bench/scenario.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace tandem::bench {
namespace {

v1::Lengths Lengths(int median, double sigma, int min, int max) {
  v1::Lengths l;
  l.set_median(median);
  l.set_sigma(sigma);
  l.set_min(min);
  l.set_max(max);
  return l;
}

struct ClassSpec {
  const char* name;
  v1::Lengths input, output;
  double shared_prefix_ratio;
  int prefix_groups;
  int concurrency;
  double slo_ttft_ms, slo_itl_ms;
  const char* corpus;
};

v1::RequestClass MakeClass(const ClassSpec& s) {
  v1::RequestClass c;
  c.set_name(s.name);
  *c.mutable_input_tokens() = s.input;
  *c.mutable_output_tokens() = s.output;
  c.set_shared_prefix_ratio(s.shared_prefix_ratio);
  c.set_prefix_groups(s.prefix_groups);
  c.set_concurrency(s.concurrency);
  c.set_slo_ttft_ms(s.slo_ttft_ms);
  c.set_slo_itl_ms(s.slo_itl_ms);
  c.set_corpus(s.corpus);
  c.set_workload(s.name);
  return c;
}

// The built-ins are sized for a small CPU deployment (a 135M model on a few
// cores finishes a run in about a minute); --concurrency, --rate and
// --requests scale them.
v1::Scenario Builtin(const std::string& name) {
  v1::Scenario s;
  s.set_name(name);
  if (name == "chat") {
    s.set_description(
        "balanced chat: ~200-token prompts behind a shared system prompt, ~128-token answers, "
        "strict latency");
    *s.add_classes() = MakeClass({"chat", Lengths(200, 0.5, 32, 1024), Lengths(128, 0.5, 16, 512),
                                  0.3, 4, 8, 1000, 100, "prose"});
  } else if (name == "long-context") {
    s.set_description("long input, short output: ~2,000-token documents summarised in ~32 tokens");
    *s.add_classes() = MakeClass({"long-context", Lengths(2000, 0.3, 1024, 4096),
                                  Lengths(32, 0.3, 16, 64), 0.0, 1, 2, 10000, 200, "prose"});
  } else if (name == "coding-agent") {
    s.set_description(
        "coding agent: a ~1,500-token context (90% shared: the tools and the repository) that "
        "grows turn by turn (4 turns, the last answer plus ~100 new tokens each), ~200-token "
        "answers, strict latency");
    v1::RequestClass c = MakeClass({"coding-agent", Lengths(1500, 0.2, 1024, 2048),
                                    Lengths(200, 0.4, 64, 400), 0.9, 1, 4, 2000, 100, "code"});
    c.set_turns(4);
    *c.mutable_turn_input_tokens() = Lengths(100, 0.5, 16, 400);
    *s.add_classes() = c;
  } else if (name == "coding-agent-edit") {
    s.set_description(
        "coding agent editing files: each session sends a source file of the repository "
        "(500-2,000 tokens) in a chat and asks for it back whole with one change (a rename, an "
        "added parameter, a changed literal), then 4 more turns that each send the file as the "
        "last answer left it and ask for another change; greedy answers that end where the model "
        "ends them; 1 client, so speculative decoding shows");
    v1::RequestClass c = MakeClass({"coding-agent-edit", Lengths(1200, 0, 500, 2000),
                                    Lengths(1200, 0, 0, 2560), 0.0, 1, 1, 5000, 100, "code"});
    c.set_turns(5);
    c.set_task("file-edit");
    *s.add_classes() = c;
  } else if (name == "long-running") {
    s.set_description(
        "long input, long output, many clients, relaxed latency: ~1,000-token prompts, "
        "~512-token outputs, 16 clients");
    *s.add_classes() = MakeClass({"long-running", Lengths(1000, 0.3, 512, 2048),
                                  Lengths(512, 0.3, 256, 1024), 0.0, 1, 16, 20000, 300, "prose"});
  } else if (name == "crossover") {
    s.set_description(
        "the threshold sweep's load: 4 clients with 128-token prompts and a fixed output length "
        "(--output_tokens), beside a background of 1,500-token prompts arriving every 5 s");
    *s.add_classes() = MakeClass({"foreground", Lengths(128, 0, 0, 0), Lengths(128, 0, 0, 0), 0.0,
                                  1, 4, 2000, 100, "prose"});
    v1::RequestClass bg = MakeClass({"long-prompts", Lengths(1500, 0, 0, 0), Lengths(16, 0, 0, 0),
                                     0.0, 1, 0, 20000, 1000, "prose"});
    bg.set_rate(0.2);
    bg.set_background(true);
    *s.add_classes() = bg;
  } else {
    s.Clear();
  }
  return s;
}

absl::Status ValidateLengths(const v1::Lengths& l, const std::string& field) {
  if (l.median() <= 0) return absl::InvalidArgumentError(field + ".median must be positive");
  if (l.sigma() < 0) return absl::InvalidArgumentError(field + ".sigma must be >= 0");
  if (l.min() < 0 || l.max() < 0 || (l.max() > 0 && l.max() < l.min())) {
    return absl::InvalidArgumentError(field + ": need 0 <= min <= max");
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> BuiltinScenarioNames() {
  return {"chat", "long-context", "coding-agent", "coding-agent-edit", "long-running", "crossover"};
}

absl::Status ValidateScenario(const v1::Scenario& scenario) {
  if (scenario.classes().empty()) {
    return absl::InvalidArgumentError("scenario '" + scenario.name() + "' has no classes");
  }
  bool foreground = false;
  for (int i = 0; i < scenario.classes_size(); ++i) {
    const v1::RequestClass& c = scenario.classes(i);
    const std::string at = absl::StrCat("classes[", i, "]");
    if (c.name().empty()) return absl::InvalidArgumentError(at + ".name is empty");
    if (absl::Status s = ValidateLengths(c.input_tokens(), at + ".input_tokens"); !s.ok()) return s;
    if (absl::Status s = ValidateLengths(c.output_tokens(), at + ".output_tokens"); !s.ok()) {
      return s;
    }
    if (c.turns() > 1 && c.task() != "file-edit") {
      if (absl::Status s = ValidateLengths(c.turn_input_tokens(), at + ".turn_input_tokens");
          !s.ok()) {
        return s;
      }
    }
    if (c.shared_prefix_ratio() < 0 || c.shared_prefix_ratio() > 1) {
      return absl::InvalidArgumentError(at + ".shared_prefix_ratio must be in [0, 1]");
    }
    if (c.prefix_groups() < 0)
      return absl::InvalidArgumentError(at + ".prefix_groups must be >= 0");
    if (c.turns() < 0) return absl::InvalidArgumentError(at + ".turns must be >= 0");
    if (c.concurrency() < 0 || c.rate() < 0 || (c.concurrency() > 0) == (c.rate() > 0)) {
      return absl::InvalidArgumentError(at + ": set exactly one of concurrency and rate");
    }
    if (c.slo_ttft_ms() <= 0 || c.slo_itl_ms() <= 0) {
      return absl::InvalidArgumentError(at + ": slo_ttft_ms and slo_itl_ms must be positive");
    }
    if (!c.corpus().empty() && c.corpus() != "prose" && c.corpus() != "code") {
      return absl::InvalidArgumentError(at + ".corpus must be \"prose\" or \"code\"");
    }
    if (!c.task().empty() && c.task() != "file-edit") {
      return absl::InvalidArgumentError(at + ".task must be \"\" or \"file-edit\"");
    }
    if (c.task() == "file-edit" && c.turn_input_tokens().median() > 0) {
      return absl::InvalidArgumentError(
          at + ".turn_input_tokens: a file-edit turn's new text is its instruction, not a length");
    }
    foreground = foreground || !c.background();
  }
  if (!foreground) return absl::InvalidArgumentError("every class is background");
  return absl::OkStatus();
}

absl::StatusOr<v1::Scenario> ParseScenario(const std::string& json) {
  v1::Scenario scenario;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  if (auto s = google::protobuf::util::JsonStringToMessage(json, &scenario, options); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("scenario JSON: ", s.ToString()));
  }
  if (absl::Status s = ValidateScenario(scenario); !s.ok()) return s;
  return scenario;
}

absl::StatusOr<v1::Scenario> LoadScenario(const std::string& name_or_path) {
  if (v1::Scenario builtin = Builtin(name_or_path); !builtin.classes().empty()) return builtin;
  std::ifstream in(name_or_path);
  if (!in) {
    std::string names;
    for (const std::string& n : BuiltinScenarioNames()) absl::StrAppend(&names, " ", n);
    return absl::NotFoundError(absl::StrCat("--scenario=", name_or_path,
                                            ": neither a built-in scenario (", names,
                                            " ) nor a readable file"));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<v1::Scenario> scenario = ParseScenario(text.str());
  if (!scenario.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_or_path, ": ", scenario.status().message()));
  }
  return scenario;
}

}  // namespace tandem::bench
