// `tandem bench`'s generator and accounting against known inputs: arrival
// statistics, percentiles (ours and Prometheus' histogram_quantile over a
// scraped difference), SLO and goodput accounting, prompts with a shared
// prefix, sessions, file-edit sessions and their instructions, speculation
// accounting, scenario files, traces and their replay timing.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <thread>

#include "client/bench/file_edits.h"
#include "client/bench/report.h"
#include "client/bench/runner.h"
#include "client/bench/scenario.h"
#include "client/bench/stats.h"
#include "client/bench/targets.h"
#include "client/bench/workload.h"

namespace tandem::bench {
namespace {

TEST(PoissonArrivals, GapsAreExponentialAtTheRateAndSeeded) {
  const double rate = 5;
  const std::vector<double> t = PoissonArrivals(rate, 20000, 42);
  ASSERT_EQ(t.size(), 20000u);
  std::vector<double> gaps = {t[0]};
  for (size_t i = 1; i < t.size(); ++i) gaps.push_back(t[i] - t[i - 1]);
  const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / gaps.size();
  double var = 0;
  for (double g : gaps) var += (g - mean) * (g - mean);
  const double cv = std::sqrt(var / gaps.size()) / mean;
  // Standard errors at n = 20,000: mean 0.7%, CV about 1%; bounds at ~4 sigma.
  EXPECT_NEAR(mean, 1 / rate, 0.03 / rate);
  EXPECT_NEAR(cv, 1.0, 0.04);
  // P(gap < mean) = 1 - 1/e for an exponential.
  const double below = std::count_if(gaps.begin(), gaps.end(), [&](double g) { return g < 0.2; }) /
                       static_cast<double>(gaps.size());
  EXPECT_NEAR(below, 1 - std::exp(-1.0), 0.015);
  EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
  EXPECT_EQ(PoissonArrivals(rate, 100, 42), std::vector<double>(t.begin(), t.begin() + 100));
  EXPECT_NE(PoissonArrivals(rate, 100, 43), std::vector<double>(t.begin(), t.begin() + 100));
}

TEST(Percentile, InterpolatesBetweenClosestRanksLikeNumpy) {
  const std::vector<double> v = {5, 1, 4, 2, 3};
  EXPECT_DOUBLE_EQ(Percentile(v, 0.5), 3);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.9), 4.6);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.99), 4.96);
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 1), 5);
  EXPECT_DOUBLE_EQ(Percentile({7}, 0.99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 0.5), 0);
}

TEST(ServerHistograms, QuantileOfTheDifferenceAsPrometheusComputesIt) {
  // Before: 10 observations; after: 110. The run's 100 fall 20 in (0, 0.1],
  // 60 in (0.1, 0.5], 20 in (0.5, 1].
  const client::Metrics before = client::ParseMetrics(
      "tandem_time_to_first_token_seconds_bucket{path=\"colocated\",le=\"0.1\"} 10\n"
      "tandem_time_to_first_token_seconds_bucket{path=\"colocated\",le=\"0.5\"} 10\n"
      "tandem_time_to_first_token_seconds_bucket{path=\"colocated\",le=\"1\"} 10\n"
      "tandem_time_to_first_token_seconds_bucket{path=\"colocated\",le=\"+Inf\"} 10\n"
      "tandem_time_to_first_token_seconds_count{path=\"colocated\"} 10\n"
      "tandem_time_to_first_token_seconds_sum{path=\"colocated\"} 0.5\n");
  const client::Metrics after = client::ParseMetrics(
      "tandem_time_to_first_token_seconds_bucket{path=\"colocated\",le=\"0.1\"} 30\n"
      "tandem_time_to_first_token_seconds_bucket{path=\"colocated\",le=\"0.5\"} 90\n"
      "tandem_time_to_first_token_seconds_bucket{path=\"colocated\",le=\"1\"} 110\n"
      "tandem_time_to_first_token_seconds_bucket{path=\"colocated\",le=\"+Inf\"} 110\n"
      "tandem_time_to_first_token_seconds_count{path=\"colocated\"} 110\n"
      "tandem_time_to_first_token_seconds_sum{path=\"colocated\"} 40.5\n");
  const std::vector<v1::ServerHistogram> h = PhaseHistograms(Difference(after, before));
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].name(), "tandem_time_to_first_token_seconds");
  EXPECT_EQ(h[0].labels(), "path=\"colocated\"");
  EXPECT_DOUBLE_EQ(h[0].count(), 100);
  EXPECT_DOUBLE_EQ(h[0].mean(), 0.4);
  // Rank 50: 30 into the (0.1, 0.5] bucket's 60 -> 0.1 + 0.4 * 30/60.
  EXPECT_DOUBLE_EQ(h[0].p50(), 0.3);
  // Rank 99: 19 into (0.5, 1]'s 20 -> 0.5 + 0.5 * 19/20.
  EXPECT_DOUBLE_EQ(h[0].p99(), 0.975);
}

v1::RunReport RunWith(double goodput, double ttft_p50) {
  v1::RunReport run;
  run.mutable_total()->set_goodput_per_s(goodput);
  run.mutable_total()->mutable_ttft_ms()->set_p50(ttft_p50);
  return run;
}

TEST(PairRatios, SayHowManyTimesBetterOursIsPairByPair) {
  // Goodput: higher is better (ours/theirs); TTFT: lower is better (theirs/ours).
  const std::vector<v1::RunReport> ours = {RunWith(2, 100), RunWith(3, 200), RunWith(1, 100)};
  const std::vector<v1::RunReport> theirs = {RunWith(1, 300), RunWith(1, 200), RunWith(1, 400)};
  const std::vector<v1::Ratio> ratios = PairRatios(ours, theirs);
  auto find = [&](const std::string& prefix) {
    for (const v1::Ratio& r : ratios) {
      if (r.measure().rfind(prefix, 0) == 0) return r;
    }
    ADD_FAILURE() << "no ratio " << prefix;
    return v1::Ratio();
  };
  const v1::Ratio goodput = find("goodput (req/s) ours/theirs");
  EXPECT_EQ(std::vector<double>(goodput.values().begin(), goodput.values().end()),
            (std::vector<double>{2, 3, 1}));
  EXPECT_DOUBLE_EQ(goodput.median(), 2);
  EXPECT_DOUBLE_EQ(goodput.min(), 1);
  EXPECT_DOUBLE_EQ(goodput.max(), 3);
  const v1::Ratio ttft = find("TTFT p50 theirs/ours");
  EXPECT_DOUBLE_EQ(ttft.median(), 3);  // of 3, 1, 4
  // Nothing to divide by: the row stays, empty, and the Markdown says so.
  const std::vector<v1::Ratio> none = PairRatios({RunWith(0.5, 100)}, {RunWith(0, 100)});
  v1::BenchReport report;
  for (const v1::Ratio& r : none) *report.add_ratios() = r;
  EXPECT_NE(ToMarkdown(report).find("| goodput (req/s) ours/theirs | n/a: the divisor was 0"),
            std::string::npos);
}

RequestRecord Record(double start, std::vector<double> token_times, bool ok = true) {
  RequestRecord r;
  r.start = start;
  r.token_times = std::move(token_times);
  r.end = r.token_times.empty() ? start : r.token_times.back();
  r.ok = ok;
  r.prompt_tokens = 100;
  return r;
}

TEST(Goodput, CountsRequestsMeetingBothSlosPerSecondOfWall) {
  // SLOs: TTFT <= 500 ms, mean inter-token latency <= 50 ms.
  const std::vector<RequestRecord> records = {
      Record(0, {0.4, 0.44, 0.48}),   // good: TTFT 400, ITL 40
      Record(0, {0.6, 0.62}),         // TTFT 600: misses
      Record(1, {1.1, 1.2, 1.3}),     // ITL 100: misses
      Record(1, {1.5}),               // good: one token, TTFT 500 (on the bound)
      Record(2, {2.1, 2.15}, false),  // failed
  };
  std::vector<const RequestRecord*> ptrs;
  for (const RequestRecord& r : records) ptrs.push_back(&r);
  const v1::ClassReport c = ReportClass("chat", false, 500, 50, ptrs, /*wall_s=*/4);
  EXPECT_EQ(c.requests(), 5);
  EXPECT_EQ(c.failures(), 1);
  EXPECT_EQ(c.good(), 2);
  EXPECT_DOUBLE_EQ(c.goodput_per_s(), 0.5);
  EXPECT_DOUBLE_EQ(c.requests_per_s(), 1.0);
  EXPECT_EQ(c.output_tokens(), 9);
  EXPECT_DOUBLE_EQ(c.output_tokens_per_s(), 2.25);
  EXPECT_EQ(c.ttft_ms().samples(), 4);
  EXPECT_NEAR(c.ttft_ms().p50(), 450, 1e-9);  // of 100, 400, 500, 600
  ASSERT_EQ(c.errors_size(), 1);
  EXPECT_EQ(c.errors(0), "(no message)");
}

TEST(Speculation, AcceptedDraftsAreTokensNoStepPaidFor) {
  // 10 tokens of which 6 came from accepted drafts: 4 steps, 2.5 tokens a
  // step; 2 tokens without speculation: 1 a step. Failed requests count not.
  std::vector<RequestRecord> records = {Record(0, std::vector<double>(10, 1.0)),
                                        Record(0, {1.0, 2.0}), Record(0, {1.0, 2.0}, false)};
  records[0].drafted_tokens = 8;
  records[0].accepted_tokens = 6;
  records[0].stopped = true;
  records[2].drafted_tokens = 5;
  records[2].accepted_tokens = 5;
  std::vector<const RequestRecord*> ptrs;
  for (const RequestRecord& r : records) ptrs.push_back(&r);
  const v1::ClassReport c = ReportClass("edit", false, 1e9, 1e9, ptrs, /*wall_s=*/1);
  EXPECT_EQ(c.output_tokens(), 12);
  EXPECT_EQ(c.drafted_tokens(), 8);
  EXPECT_EQ(c.accepted_tokens(), 6);
  EXPECT_DOUBLE_EQ(c.tokens_per_step(), 2.0);  // 12 tokens in 6 steps
  EXPECT_EQ(c.stopped(), 1);
}

TEST(TokenGaps, AMessageOfKTokensSharesItsGapEvenly) {
  // Tokens at 0.1; then 3 at 0.4 (a speculative burst); then 1 at 0.5.
  const RequestRecord r = Record(0, {0.1, 0.4, 0.4, 0.4, 0.5});
  const std::vector<double> gaps = TokenGapsMs(r);
  ASSERT_EQ(gaps.size(), 4u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(gaps[i], 100, 1e-9);
  EXPECT_NEAR(gaps[3], 100, 1e-9);
  EXPECT_NEAR(r.MeanItlMs(), 100, 1e-9);
}

TEST(FileEdits, InstructionsNameWhatTheFileHas) {
  const std::string code =
      "// A comment: ignored_identifier ignored_identifier ignored_identifier\n"
      "#include <counter_header>\n"
      "int AddCounter(int counter_value) {\n"
      "  return counter_value + 42 + counter_value;\n"
      "}\n"
      "int Twice(int counter_value) { return AddCounter(counter_value) * 42; }\n";
  EXPECT_EQ(EditInstruction(code, 0), "Rename `counter_value` to `counter_value_v2` everywhere");
  EXPECT_EQ(EditInstruction(code, 1),
            "Add a last parameter `bool verbose` to the function `AddCounter` (and pass `false` "
            "wherever the file calls it)");
  EXPECT_EQ(EditInstruction(code, 2), "Change the number 42 to 84 everywhere in the file");
  EXPECT_EQ(EditInstruction(code, 5), EditInstruction(code, 2));  // kind % 3
  // Nothing to change a literal of: the rename (capitalised names get V2).
  EXPECT_EQ(EditInstruction("void Widget(Widget w) { Widget(w); }\n", 2),
            "Rename `Widget` to `WidgetV2` everywhere");
  EXPECT_EQ(FirstEditMessage("int x;\n", "Rename `x` to `y` everywhere"),
            "Here is a source file:\n```cpp\nint x;\n```\nRename `x` to `y` everywhere, and "
            "return the whole file.");
}

TEST(FileEdits, LinesKeptCountEachSentLineOnceWhateverItsIndent) {
  const std::string file = "int a;\n\n  int b;\nint b;\nreturn 0;\n";
  // Re-indented and one "int b;" kept; "return 0;" renamed away; blank
  // lines count for nothing.
  const LinesKept kept = CountLinesKept(file, "int a;\nint b;\n\nreturn 1;\n");
  EXPECT_EQ(kept.lines, 4);
  EXPECT_EQ(kept.kept, 2);
  EXPECT_EQ(CountLinesKept(file, file).kept, 4);
  EXPECT_EQ(CountLinesKept(file, "int b;\nint b;\nint b;\n").kept, 2);  // a repeat counts once
  EXPECT_EQ(CountLinesKept("", "int a;\n").lines, 0);
}

TEST(FileEdits, TheAnswersCodeIsItsFirstFence) {
  EXPECT_EQ(AnswerCode("Sure.\n```cpp\nint a;\nint b;\n```\nThat is all.\n```\nx\n```"),
            "int a;\nint b;\n");
  EXPECT_EQ(AnswerCode("```\nint a;\n"), "int a;\n");  // cut off before its close
  EXPECT_EQ(AnswerCode("int a;\n"), "int a;\n");       // no fence: all of it
}

TEST(Scenarios, BuiltinsAreValidAndFilesAreCheckedByField) {
  for (const std::string& name : BuiltinScenarioNames()) {
    absl::StatusOr<v1::Scenario> s = LoadScenario(name);
    ASSERT_TRUE(s.ok()) << name << ": " << s.status();
    EXPECT_EQ(s->name(), name);
  }
  absl::StatusOr<v1::Scenario> custom = ParseScenario(R"({
    "name": "mine",
    "classes": [{"name": "q", "input_tokens": {"median": 64}, "output_tokens": {"median": 8},
                 "rate": 2.5, "slo_ttft_ms": 300, "slo_itl_ms": 40}]})");
  ASSERT_TRUE(custom.ok()) << custom.status();
  EXPECT_DOUBLE_EQ(custom->classes(0).rate(), 2.5);

  absl::StatusOr<v1::Scenario> unknown = ParseScenario(R"({"name": "x", "clases": []})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("clases"), std::string::npos) << unknown.status();
  absl::StatusOr<v1::Scenario> both = ParseScenario(R"({"name": "x", "classes": [
    {"name": "q", "input_tokens": {"median": 64}, "output_tokens": {"median": 8},
     "rate": 1, "concurrency": 2, "slo_ttft_ms": 300, "slo_itl_ms": 40}]})");
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("classes[0]: set exactly one of concurrency and rate"),
            std::string::npos)
      << both.status();
  absl::StatusOr<v1::Scenario> ratio = ParseScenario(R"({"name": "x", "classes": [
    {"name": "q", "input_tokens": {"median": 64}, "output_tokens": {"median": 8},
     "shared_prefix_ratio": 1.5, "rate": 1, "slo_ttft_ms": 300, "slo_itl_ms": 40}]})");
  ASSERT_FALSE(ratio.ok());
  EXPECT_NE(ratio.status().message().find("classes[0].shared_prefix_ratio"), std::string::npos);
  absl::StatusOr<v1::Scenario> task = ParseScenario(R"({"name": "x", "classes": [
    {"name": "q", "input_tokens": {"median": 64}, "output_tokens": {"median": 8},
     "rate": 1, "slo_ttft_ms": 300, "slo_itl_ms": 40, "task": "edit"}]})");
  ASSERT_FALSE(task.ok());
  EXPECT_NE(task.status().message().find("classes[0].task"), std::string::npos) << task.status();
  EXPECT_EQ(LoadScenario("coding-agent-edit")->classes(0).task(), "file-edit");
  EXPECT_EQ(LoadScenario("no-such-scenario").status().code(), absl::StatusCode::kNotFound);
}

TEST(Traces, ParseInOrderAndRejectWhatCannotBeReplayed) {
  absl::StatusOr<std::vector<v1::TraceRecord>> t = ParseTrace(
      "{\"arrival_s\": 0.0, \"input_tokens\": 32, \"output_tokens\": 4}\n\n"
      "{\"arrival_s\": 0.25, \"prompt\": \"Hello there\", \"output_tokens\": 2}\n");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[1].prompt(), "Hello there");
  EXPECT_FALSE(ParseTrace("{\"arrival_s\": 1, \"input_tokens\": 3, \"output_tokens\": 4}\n"
                          "{\"arrival_s\": 0.5, \"input_tokens\": 3, \"output_tokens\": 4}")
                   .ok());
  absl::Status s =
      ParseTrace("{\"arrival_s\": 0, \"input_tokens\": 3, \"prompt\": \"x\", \"output_tokens\": 4}")
          .status();
  EXPECT_NE(s.message().find("line 1: set exactly one of prompt and input_tokens"),
            std::string::npos)
      << s;
  EXPECT_NE(ParseTrace("{\"arrival\": 0}").status().message().find("line 1"), std::string::npos);
}

// A corpus of distinct token ids, so any shared run of tokens is intended.
Corpus DistinctCorpus() {
  TokenIds ids(100000);
  std::iota(ids.begin(), ids.end(), 0u);
  return Corpus(std::move(ids));
}

size_t CommonPrefix(const TokenIds& a, const TokenIds& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

TEST(Prompts, ShareExactlyTheirGroupsPrefix) {
  const Corpus corpus = DistinctCorpus();
  v1::RequestClass c;
  c.set_name("chat");
  c.set_shared_prefix_ratio(0.25);
  c.set_prefix_groups(2);
  const PromptBuilder builder(corpus, c, 7);
  const TokenIds a = builder.Prompt(0, 200), b = builder.Prompt(2, 200),
                 other = builder.Prompt(1, 200);
  ASSERT_EQ(a.size(), 200u);
  EXPECT_EQ(CommonPrefix(a, b), 50u);  // same group (0 and 2): 25% of 200
  EXPECT_EQ(CommonPrefix(a, other), 0u);
  EXPECT_EQ(builder.Prompt(0, 200), a);  // deterministic
}

// A target that answers with `output` ids 1000, 1001, ... and records calls.
class FakeTarget : public Target {
 public:
  std::string name() const override { return "fake"; }
  absl::StatusOr<TokenIds> Tokenize(const std::string& text) override {
    return TokenIds(text.size(), 5);
  }
  // Records the conversation; one id per character of its messages.
  absl::StatusOr<TokenIds> TokenizeChat(const std::vector<ChatTurn>& messages) override {
    std::lock_guard<std::mutex> lock(mu_);
    chats_.push_back(messages);
    size_t chars = 0;
    for (const ChatTurn& m : messages) chars += m.content.size();
    return TokenIds(chars, 7);
  }

  void Generate(const GenerateCall& call, RequestRecord* record, Generated* output) override {
    const double now = NowSeconds();
    {
      std::unique_lock<std::mutex> lock(mu_);
      calls_.push_back({now, call});
      // A file-edit answer: prose around a fence holding code that names
      // the call.
      if (call.want_text) {
        output->text = "Here it is:\n```cpp\nint edited_" + std::to_string(calls_.size()) +
                       "(int argument) { return argument; }\n```\nDone.";
      }
      ++inflight_;
      max_inflight_ = std::max(max_inflight_, inflight_);
      cv_.notify_all();
      if (hold_until_inflight_ > 0) {
        cv_.wait_for(lock, std::chrono::seconds(10),
                     [&] { return inflight_ >= hold_until_inflight_ || released_; });
        released_ = true;  // once the clients overlapped, stop holding
      }
      --inflight_;
    }
    for (int i = 0; i < call.max_tokens; ++i) {
      record->token_times.push_back(NowSeconds());
      output->ids.push_back(1000 + i);
    }
    record->ok = true;
    record->prompt_tokens = static_cast<int>(call.prompt.size());
  }

  struct Call {
    double at;
    GenerateCall call;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call> calls_;
  std::vector<std::vector<ChatTurn>> chats_;
  int inflight_ = 0, max_inflight_ = 0, hold_until_inflight_ = 0;
  bool released_ = false;
};

v1::Scenario OneClass(int concurrency, double rate, int turns = 0) {
  v1::Scenario s;
  s.set_name("test");
  v1::RequestClass* c = s.add_classes();
  c->set_name("c");
  c->mutable_input_tokens()->set_median(20);
  c->mutable_output_tokens()->set_median(3);
  c->set_concurrency(concurrency);
  c->set_rate(rate);
  c->set_turns(turns);
  c->mutable_turn_input_tokens()->set_median(5);
  c->set_slo_ttft_ms(1000);
  c->set_slo_itl_ms(1000);
  return s;
}

TEST(Runner, ClosedLoopIssuesExactlyTheRequestsWithTheConcurrency) {
  PromptSources corpora;
  corpora.corpora = {{"prose", DistinctCorpus()}};
  FakeTarget target;
  target.hold_until_inflight_ = 3;
  RunOptions options;
  options.requests = 9;
  const RunResult result = RunScenario(OneClass(3, 0), target, corpora, options);
  EXPECT_EQ(result.records.size(), 9u);
  EXPECT_EQ(target.max_inflight_, 3);
  // Single requests are no session: no balancer should pin them.
  for (const auto& c : target.calls_) EXPECT_EQ(c.call.session_id, "");
  for (const RequestRecord& r : result.records) {
    EXPECT_TRUE(r.ok);
    EXPECT_EQ(r.token_times.size(), 3u);
  }
}

TEST(Runner, SessionTurnsCarryThePreviousPromptAndAnswer) {
  PromptSources corpora;
  corpora.corpora = {{"prose", DistinctCorpus()}};
  FakeTarget target;
  RunOptions options;
  options.requests = 6;
  options.seed = 7;
  RunScenario(OneClass(1, 0, /*turns=*/3), target, corpora, options);
  ASSERT_EQ(target.calls_.size(), 6u);
  // Each session's turns share one id (class, seed, session), which a
  // balancer hashes to keep them on one daemon.
  for (int t = 0; t < 6; ++t) {
    EXPECT_EQ(target.calls_[t].call.session_id, t < 3 ? "c-7-0" : "c-7-1") << t;
  }
  for (int t = 1; t < 3; ++t) {
    const TokenIds& before = target.calls_[t - 1].call.prompt;
    const TokenIds& now = target.calls_[t].call.prompt;
    ASSERT_EQ(now.size(), before.size() + 3 + 5);
    EXPECT_TRUE(std::equal(before.begin(), before.end(), now.begin()));
    EXPECT_EQ(TokenIds(now.begin() + before.size(), now.begin() + before.size() + 3),
              (TokenIds{1000, 1001, 1002}));
  }
}

TEST(Runner, SessionIdsAreHeaderSafeWhateverTheClassIsCalled) {
  // gRPC refuses metadata values with other characters: every call of the
  // session would fail.
  PromptSources corpora;
  corpora.corpora = {{"prose", DistinctCorpus()}};
  FakeTarget target;
  v1::Scenario scenario = OneClass(1, 0, /*turns=*/2);
  scenario.mutable_classes(0)->set_name("agent turns/é\n");
  RunOptions options;
  options.requests = 2;
  RunScenario(scenario, target, corpora, options);
  ASSERT_EQ(target.calls_.size(), 2u);
  for (const auto& c : target.calls_) EXPECT_EQ(c.call.session_id, "agent_turns____-1-0");
}

TEST(Runner, FileEditTurnsSendTheFileAsTheLastAnswerLeftIt) {
  PromptSources sources;
  sources.corpora = {{"prose", DistinctCorpus()}};
  const std::string editable = "int compute_value(int counter) { return counter * 10; }\n";
  sources.files = {
      {"short.cc", "int a;\n", 300}, {"editable.cc", editable, 600}, {"long.cc", "int b;\n", 3000}};
  FakeTarget target;
  v1::Scenario scenario = OneClass(1, 0, /*turns=*/3);
  v1::RequestClass& c = *scenario.mutable_classes(0);
  c.set_task("file-edit");
  c.clear_turn_input_tokens();
  *c.mutable_input_tokens() = v1::Lengths();
  c.mutable_input_tokens()->set_median(1000);
  c.mutable_input_tokens()->set_min(500);
  c.mutable_input_tokens()->set_max(2000);
  ASSERT_TRUE(ValidateScenario(scenario).ok()) << ValidateScenario(scenario);
  RunOptions options;
  options.requests = 3;
  const RunResult result = RunScenario(scenario, target, sources, options);
  ASSERT_EQ(result.records.size(), 3u);
  for (const RequestRecord& r : result.records) EXPECT_TRUE(r.ok) << r.error;
  ASSERT_EQ(target.chats_.size(), 3u);
  ASSERT_EQ(target.calls_.size(), 3u);
  // Turn 1: the only file of 500-2,000 tokens. Turns 2 and 3: the code of
  // the answer before, each with the next kind of change.
  const std::vector<std::string> files = {editable,
                                          "int edited_1(int argument) { return argument; }\n",
                                          "int edited_2(int argument) { return argument; }\n"};
  for (int turn = 0; turn < 3; ++turn) {
    SCOPED_TRACE(turn);
    ASSERT_EQ(target.chats_[turn].size(), 1u);
    EXPECT_EQ(target.chats_[turn][0].role, "user");
    // Session 0 asks for changes of kinds 0, 1, 2 turn by turn.
    EXPECT_EQ(target.chats_[turn][0].content,
              FirstEditMessage(files[turn], EditInstruction(files[turn], turn)));
    const GenerateCall& call = target.calls_[turn].call;
    EXPECT_EQ(call.session_id, "c-1-0");  // one file's turns, one session (seed 1)
    EXPECT_EQ(call.prompt.size(), target.chats_[turn][0].content.size());
    EXPECT_TRUE(call.stop_at_end);
    EXPECT_TRUE(call.want_text);
    EXPECT_EQ(call.max_tokens, 600 + 150 + 64);  // the file with room for its change
  }
  // Each answer's code shares no line with the file it was sent.
  for (const RequestRecord& r : result.records) {
    EXPECT_EQ(r.edit_file_lines, 1);
    EXPECT_EQ(r.edit_lines_kept, 0);
  }
}

TEST(Runner, TraceReplaySendsEachRequestNoEarlierThanItsArrival) {
  PromptSources corpora;
  corpora.corpora = {{"prose", DistinctCorpus()}};
  FakeTarget target;
  RunOptions options;
  options.duration_s = 30;
  absl::StatusOr<std::vector<v1::TraceRecord>> trace = ParseTrace(
      "{\"arrival_s\": 0.05, \"input_tokens\": 10, \"output_tokens\": 2}\n"
      "{\"arrival_s\": 0.20, \"prompt\": \"abcd\", \"output_tokens\": 1}\n"
      "{\"arrival_s\": 0.30, \"input_tokens\": 7, \"output_tokens\": 3}\n");
  ASSERT_TRUE(trace.ok());
  options.trace = *trace;
  const double before = NowSeconds();
  const RunResult result =
      RunScenario(EffectiveScenario(OneClass(1, 0), options), target, corpora, options);
  ASSERT_EQ(result.records.size(), 3u);
  ASSERT_EQ(target.calls_.size(), 3u);
  std::sort(target.calls_.begin(), target.calls_.end(),
            [](const auto& a, const auto& b) { return a.at < b.at; });
  const double arrivals[] = {0.05, 0.20, 0.30};
  const size_t lengths[] = {10, 4, 7};  // "abcd" tokenizes to 4 ids here
  const int outputs[] = {2, 1, 3};
  for (int i = 0; i < 3; ++i) {
    EXPECT_GE(target.calls_[i].at - before, arrivals[i]) << i;
    EXPECT_EQ(target.calls_[i].call.prompt.size(), lengths[i]) << i;
    EXPECT_EQ(target.calls_[i].call.max_tokens, outputs[i]) << i;
  }
  // Latency counts from the scheduled arrival.
  std::vector<double> starts;
  for (const RequestRecord& r : result.records) starts.push_back(r.start);
  std::sort(starts.begin(), starts.end());
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(starts[i], arrivals[i], 1e-6);
}

TEST(EffectiveScenario, OverridesApplyToTheForegroundOnly) {
  v1::Scenario s = OneClass(2, 0);
  // A range that would clamp the fixed length if it were kept.
  s.mutable_classes(0)->mutable_output_tokens()->set_min(100);
  s.mutable_classes(0)->mutable_output_tokens()->set_max(200);
  v1::RequestClass bg = s.classes(0);
  bg.set_name("bg");
  bg.set_background(true);
  bg.set_concurrency(0);
  bg.set_rate(0.5);
  *s.add_classes() = bg;
  RunOptions options;
  options.rate = 3;
  options.output_tokens = 77;
  options.slo_ttft_ms = 250;
  options.slo_itl_ms = 40;
  const v1::Scenario e = EffectiveScenario(s, options);
  EXPECT_EQ(e.classes(0).concurrency(), 0);
  EXPECT_DOUBLE_EQ(e.classes(0).rate(), 3);
  EXPECT_EQ(e.classes(0).output_tokens().median(), 77);
  EXPECT_DOUBLE_EQ(e.classes(0).output_tokens().sigma(), 0);
  EXPECT_EQ(e.classes(0).output_tokens().min(), 0);
  EXPECT_EQ(e.classes(0).output_tokens().max(), 0);
  std::mt19937_64 rng(1);
  EXPECT_EQ(DrawLength(e.classes(0).output_tokens(), rng), 77);
  EXPECT_DOUBLE_EQ(e.classes(0).slo_ttft_ms(), 250);
  EXPECT_DOUBLE_EQ(e.classes(0).slo_itl_ms(), 40);
  EXPECT_TRUE(ValidateScenario(e).ok());
  // The background keeps its own load, lengths and SLOs.
  EXPECT_DOUBLE_EQ(e.classes(1).rate(), 0.5);
  EXPECT_EQ(e.classes(1).output_tokens().median(), 3);
  EXPECT_DOUBLE_EQ(e.classes(1).slo_ttft_ms(), 1000);
}

TEST(Runner, BackgroundStopsWhenTheForegroundIsDone) {
  PromptSources corpora;
  corpora.corpora = {{"prose", DistinctCorpus()}};
  FakeTarget target;
  v1::Scenario s = OneClass(2, 0);
  v1::RequestClass bg = s.classes(0);
  bg.set_name("bg");
  bg.set_background(true);
  bg.set_concurrency(0);
  bg.set_rate(1000);
  *s.add_classes() = bg;
  RunOptions options;
  options.requests = 4;
  options.duration_s = 60;
  const RunResult result = RunScenario(s, target, corpora, options);
  int foreground = 0;
  for (const RequestRecord& r : result.records) foreground += r.class_index == 0;
  EXPECT_EQ(foreground, 4);
  const v1::RunReport report = BuildRunReport(s, "fake", result);
  EXPECT_EQ(report.total().requests(), 4);
  ASSERT_EQ(report.classes_size(), 2);
  EXPECT_TRUE(report.classes(1).background());
}

// A stand-in for llama-server's HTTP API on a loopback port: /tokenize
// answers three ids; /completion streams `n_predict` server-sent events of
// one token each (ids 100, 101, ...) and a final event with timings, or
// HTTP 400 when the prompt is empty. One connection at a time.
class FakeLlamaServer {
 public:
  FakeLlamaServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    EXPECT_EQ(::listen(fd_, 8), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeLlamaServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string last_body() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_body_;
  }

 private:
  void Serve() {
    for (;;) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string request;
      char buf[4096];
      size_t need = std::string::npos;
      ssize_t n;
      while ((n = ::read(c, buf, sizeof(buf))) > 0) {
        request.append(buf, static_cast<size_t>(n));
        const size_t head = request.find("\r\n\r\n");
        if (head == std::string::npos) continue;
        if (need == std::string::npos) {
          const size_t cl = request.find("Content-Length: ");
          need = head + 4 + (cl == std::string::npos ? 0 : std::stoul(request.substr(cl + 16)));
        }
        if (request.size() >= need) break;
      }
      const std::string body = request.substr(request.find("\r\n\r\n") + 4);
      {
        std::lock_guard<std::mutex> lock(mu_);
        last_body_ = body;
      }
      std::string response;
      if (request.rfind("POST /tokenize", 0) == 0) {
        const std::string json = "{\"tokens\":[11,12,13]}";
        response = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                   std::to_string(json.size()) + "\r\nConnection: close\r\n\r\n" + json;
      } else if (body.find("\"prompt\":[]") != std::string::npos) {
        const std::string json = "{\"error\":{\"code\":400,\"message\":\"empty prompt\"}}";
        response =
            "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
            "Content-Length: " +
            std::to_string(json.size()) + "\r\nConnection: close\r\n\r\n" + json;
      } else {
        const size_t at = body.find("\"n_predict\":");
        const int n_predict = std::stoi(body.substr(at + 12));
        response =
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
        for (int i = 0; i < n_predict; ++i) {
          response += "data: {\"content\":\"x\",\"tokens\":[" + std::to_string(100 + i) +
                      "],\"stop\":false}\n\n";
        }
        response += "data: {\"content\":\"\",\"tokens\":[],\"stop\":true,\"tokens_predicted\":" +
                    std::to_string(n_predict) +
                    ",\"stop_type\":\"limit\",\"timings\":{\"cache_n\":7,\"prompt_n\":3,"
                    "\"draft_n\":4,\"draft_n_accepted\":3}}\n\n";
      }
      size_t sent = 0;
      while (sent < response.size()) {
        const ssize_t w = ::write(c, response.data() + sent, response.size() - sent);
        if (w <= 0) break;
        sent += static_cast<size_t>(w);
      }
      ::close(c);
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::string last_body_;
};

TEST(LlamaServerTarget, StreamsTokensAndReadsTheCacheFromTheFinalEvent) {
  FakeLlamaServer server;
  std::unique_ptr<Target> target = MakeLlamaServerTarget(server.address());
  absl::StatusOr<TokenIds> ids = target->Tokenize("some text");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (TokenIds{11, 12, 13}));

  GenerateCall call;
  call.prompt = {5, 6, 7, 8};
  call.max_tokens = 5;
  RequestRecord record;
  call.want_text = true;
  Generated output;
  target->Generate(call, &record, &output);
  EXPECT_TRUE(record.ok) << record.error;
  EXPECT_EQ(output.ids, (TokenIds{100, 101, 102, 103, 104}));
  EXPECT_EQ(output.text, "xxxxx");
  // The final event's speculation counts and why it stopped (n_predict ran out).
  EXPECT_EQ(record.drafted_tokens, 4);
  EXPECT_EQ(record.accepted_tokens, 3);
  EXPECT_FALSE(record.stopped);
  EXPECT_EQ(record.token_times.size(), 5u);
  EXPECT_EQ(record.cached_prompt_tokens, 7);
  EXPECT_EQ(record.prompt_tokens, 4);
  // The same request tandemd gets: token ids, greedy, exact length.
  const std::string body = server.last_body();
  EXPECT_NE(body.find("\"prompt\":[5,6,7,8]"), std::string::npos) << body;
  EXPECT_NE(body.find("\"n_predict\":5"), std::string::npos) << body;
  EXPECT_NE(body.find("\"ignore_eos\":true"), std::string::npos) << body;
  EXPECT_NE(body.find("\"temperature\":0"), std::string::npos) << body;

  call.stop_at_end = true;
  RequestRecord stopped;
  Generated answer;
  target->Generate(call, &stopped, &answer);
  EXPECT_NE(server.last_body().find("\"ignore_eos\":false"), std::string::npos)
      << server.last_body();

  RequestRecord failed;
  Generated none;
  call.prompt.clear();
  target->Generate(call, &failed, &none);
  EXPECT_FALSE(failed.ok);
  EXPECT_NE(failed.error.find("HTTP 400"), std::string::npos) << failed.error;
}

}  // namespace
}  // namespace tandem::bench
