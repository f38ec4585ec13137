// Speculative decoding through tandemd: the flags, GetModelInfo, the
// per-request opt-out, the usage fields and the metrics, which must count
// exactly what the responses report.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <sstream>

#include "tests/e2e/daemon.h"
#include "tests/test_paths.h"

namespace tandem::testing {
namespace {

using ::testing::HasSubstr;

// The sum of the samples of `name` whose labels contain every one of
// `labels` (e.g. proposer="ngram"), from Prometheus text.
double LabelledSum(const std::string& text, const std::string& name,
                   const std::vector<std::string>& labels) {
  double sum = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + "{", 0) != 0) continue;
    const size_t close = line.find('}');
    const std::string label_text = line.substr(name.size() + 1, close - name.size() - 1);
    bool match = true;
    for (const std::string& l : labels) match &= label_text.find(l) != std::string::npos;
    if (match) sum += std::stod(line.substr(close + 1));
  }
  return sum;
}

// A request whose answer repeats its prompt: n-gram drafts get accepted.
v1::GenerateRequest CopyRequest() {
  return Chat(
      "Repeat this list exactly, one item per line:\napple\nbanana\ncherry\ndate\nelderberry\n"
      "fig\ngrape\nhoneydew\nkiwi\nlemon",
      0.0f, 40);
}

struct Totals {
  int64_t drafted = 0;
  int64_t accepted = 0;
};

void ExpectMetricsMatch(Daemon& daemon, const std::string& proposer, const Totals& totals) {
  const std::optional<std::string> metrics = HttpGet(daemon.metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.has_value());
  const std::string label = "proposer=\"" + proposer + "\"";
  EXPECT_EQ(LabelledSum(*metrics, "tandem_speculative_drafted_tokens_total", {label}),
            totals.drafted);
  EXPECT_EQ(LabelledSum(*metrics, "tandem_speculative_accepted_tokens_total", {label}),
            totals.accepted);
  // Acceptance by position adds up to the same totals, and falls with the
  // position (a token is accepted only after every one before it).
  EXPECT_EQ(LabelledSum(*metrics, "tandem_speculative_position_drafted_total", {label}),
            totals.drafted);
  EXPECT_EQ(LabelledSum(*metrics, "tandem_speculative_position_accepted_total", {label}),
            totals.accepted);
  const double first = LabelledSum(*metrics, "tandem_speculative_position_accepted_total",
                                   {label, "position=\"1\""});
  const double second = LabelledSum(*metrics, "tandem_speculative_position_accepted_total",
                                    {label, "position=\"2\""});
  EXPECT_GE(first, second);
  // The accepted-length histogram: one observation per verification, their
  // sum the accepted tokens.
  EXPECT_EQ(LabelledSum(*metrics, "tandem_speculative_accepted_length_sum", {label}),
            totals.accepted);
  EXPECT_EQ(LabelledSum(*metrics, "tandem_speculative_accepted_length_count", {label}),
            LabelledSum(*metrics, "tandem_speculative_position_drafted_total",
                        {label, "position=\"1\""}));
}

double Metric(Daemon& daemon, const std::string& name, const std::vector<std::string>& labels) {
  const std::optional<std::string> metrics = HttpGet(daemon.metrics_port(), "/metrics");
  EXPECT_TRUE(metrics.has_value());
  if (!metrics.has_value()) return -1;
  if (labels.empty()) {
    // An unlabelled gauge: the line "name value".
    std::istringstream lines(*metrics);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
    }
    return -1;
  }
  return LabelledSum(*metrics, name, labels);
}

// The suffix cache of a --speculative=suffix daemon that has finished four
// requests (`first` among them, unsalted): a request drafts from an earlier
// request's text of its own salt (the whole answer, copied), never from
// another salt's; the metrics count the texts and the drafts by source.
void ExpectSuffixCacheDraftsAcrossRequestsOfOneSalt(Daemon& daemon, const Generation& first) {
  EXPECT_EQ(Metric(daemon, "tandem_speculation_cache_texts", {}), 4);
  EXPECT_GT(Metric(daemon, "tandem_speculation_cache_bytes", {}), 0);
  const std::vector<std::string> global = {"proposer=\"suffix\"", "source=\"global\""};
  auto stub = daemon.Stub();
  v1::GenerateRequest salted = CopyRequest();
  salted.set_cache_salt("tenant-a");
  const Generation a1 = Generate(*stub, salted);
  ASSERT_TRUE(a1.status.ok()) << a1.status.error_message();
  const double global_accepted = Metric(daemon, "tandem_speculative_accepted_tokens_total", global);
  // A second request of that salt copies the first one's answer.
  const Generation a2 = Generate(*stub, salted);
  ASSERT_TRUE(a2.status.ok());
  EXPECT_EQ(a2.token_ids, first.token_ids);
  EXPECT_GE(Metric(daemon, "tandem_speculative_accepted_tokens_total", global) - global_accepted,
            static_cast<double>(first.token_ids.size()) / 2)
      << "most of the answer is accepted from the earlier request's text";
  // Another salt's request drafts nothing from either tenant's text.
  salted.set_cache_salt("tenant-b");
  const double before_b = Metric(daemon, "tandem_speculative_drafted_tokens_total", global);
  const Generation b = Generate(*stub, salted);
  ASSERT_TRUE(b.status.ok());
  EXPECT_EQ(b.token_ids, first.token_ids);
  EXPECT_GT(b.last.usage().drafted_tokens(), 0) << "from its own prompt";
  EXPECT_EQ(Metric(daemon, "tandem_speculative_drafted_tokens_total", global), before_b);
  EXPECT_EQ(Metric(daemon, "tandem_speculation_cache_texts", {}), 7);
}

// A proposer that copies from the sequence's own text (ngram, suffix):
// greedy and seeded answers are those without drafts, and the metrics count
// exactly what the responses' usage reports.
void ExpectCopiedDraftsChangeNoTokenAndAreReportedExactly(const std::string& proposer) {
  Daemon daemon({"--speculative=" + proposer, "--spec_adaptive=false", "--spec_max_draft=6"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  EXPECT_THAT(daemon.Log(), HasSubstr("speculative decoding: " + proposer));
  auto stub = daemon.Stub();
  {
    grpc::ClientContext context;
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.speculative(), proposer);
  }
  Totals totals;
  const Generation drafted = Generate(*stub, CopyRequest());
  ASSERT_TRUE(drafted.status.ok()) << drafted.status.error_message();
  const v1::Usage& usage = drafted.last.usage();
  EXPECT_GT(usage.accepted_tokens(), 0);
  EXPECT_LE(usage.accepted_tokens(), usage.drafted_tokens());
  totals.drafted += usage.drafted_tokens();
  totals.accepted += usage.accepted_tokens();

  // The opt-out: the same tokens, nothing drafted.
  v1::GenerateRequest opt_out = CopyRequest();
  opt_out.set_disable_speculation(true);
  const Generation plain = Generate(*stub, opt_out);
  ASSERT_TRUE(plain.status.ok());
  EXPECT_EQ(plain.token_ids, drafted.token_ids);
  EXPECT_EQ(plain.text, drafted.text);
  EXPECT_EQ(plain.last.usage().drafted_tokens(), 0);
  EXPECT_EQ(plain.last.usage().accepted_tokens(), 0);

  // Seeded sampling with copied drafts: the very tokens of no drafts.
  v1::GenerateRequest sampled = CopyRequest();
  sampled.mutable_sampling()->set_temperature(0.7f);
  sampled.mutable_sampling()->set_seed(99);
  const Generation with = Generate(*stub, sampled);
  sampled.set_disable_speculation(true);
  const Generation without = Generate(*stub, sampled);
  ASSERT_TRUE(with.status.ok() && without.status.ok());
  EXPECT_EQ(with.token_ids, without.token_ids);
  totals.drafted += with.last.usage().drafted_tokens();
  totals.accepted += with.last.usage().accepted_tokens();

  ExpectMetricsMatch(daemon, proposer, totals);
  if (proposer == "suffix") ExpectSuffixCacheDraftsAcrossRequestsOfOneSalt(daemon, drafted);
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(SpeculationE2eTest, NgramDraftsChangeNoTokenAndAreReportedExactly) {
  ExpectCopiedDraftsChangeNoTokenAndAreReportedExactly("ngram");
}

TEST(SpeculationE2eTest, SuffixDraftsChangeNoTokenAndAreReportedExactly) {
  ExpectCopiedDraftsChangeNoTokenAndAreReportedExactly("suffix");
}

TEST(SpeculationE2eTest, SelfDraftGivesTheSameGreedyTokens) {
  Daemon daemon({"--speculative=draft", "--draft_layers=20", "--spec_adaptive=false",
                 "--spec_max_draft=4", "--disagg_output_threshold=off"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  auto stub = daemon.Stub();
  Totals totals;
  for (const char* question : {"What is the capital of France?", "Name three animals."}) {
    v1::GenerateRequest request = Chat(question, 0.0f, 24);
    const Generation drafted = Generate(*stub, request);
    request.set_disable_speculation(true);
    const Generation plain = Generate(*stub, request);
    ASSERT_TRUE(drafted.status.ok() && plain.status.ok());
    EXPECT_EQ(drafted.token_ids, plain.token_ids) << question;
    EXPECT_GT(drafted.last.usage().drafted_tokens(), 0);
    totals.drafted += drafted.last.usage().drafted_tokens();
    totals.accepted += drafted.last.usage().accepted_tokens();
  }
  EXPECT_LT(totals.accepted, totals.drafted) << "no rejection: the check saw nothing";
  ExpectMetricsMatch(daemon, "draft", totals);
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

// A separate draft model file on both workers: a request handed from the
// prefill worker to the decode worker mid-decode keeps drafting with the
// draft KV both share. The draft is the target's own file, so every draft
// must be accepted (a draft KV out of step would be rejected).
TEST(SpeculationE2eTest, ASeparateDraftModelServesBothWorkers) {
  const std::string model = PathFromEnv("TANDEM_TEST_MODEL", paths::kTestModel);
  Daemon daemon({"--speculative=draft", "--draft_model=" + model, "--spec_adaptive=false",
                 "--spec_max_draft=4", "--disagg_output_threshold=32"});
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  EXPECT_THAT(daemon.Log(), HasSubstr(model));
  auto stub = daemon.Stub();
  v1::GenerateRequest request = Chat("Write a short poem about the sea.", 0.0f, 48);
  request.set_ignore_eos(true);
  const Generation drafted = Generate(*stub, request);
  request.set_disable_speculation(true);
  const Generation plain = Generate(*stub, request);
  ASSERT_TRUE(drafted.status.ok() && plain.status.ok());
  EXPECT_EQ(drafted.token_ids, plain.token_ids);
  EXPECT_EQ(drafted.last.path(), v1::PATH_DISAGGREGATED);
  EXPECT_GT(drafted.last.usage().drafted_tokens(), 0);
  EXPECT_EQ(drafted.last.usage().accepted_tokens(), drafted.last.usage().drafted_tokens());
  EXPECT_EQ(daemon.Stop(SIGTERM), 0);
}

TEST(SpeculationE2eTest, BadSpeculationFlagsStopTheDaemonWithAClearMessage) {
  const std::string model = PathFromEnv("TANDEM_TEST_MODEL", paths::kTestModel);
  ExpectStartupErrors({
      {{"--speculative=bogus"}, 2, "--speculative='bogus': expected off, ngram, suffix or draft"},
      {{"--speculative=draft"},
       2,
       "--speculative=draft needs a draft model: set --draft_model or --draft_layers"},
      {{"--speculative=draft", "--draft_layers=30"},
       1,
       "--draft_layers=30: the self-draft needs 1..29 of the model's 30 layers"},
      {{"--speculative=draft", "--draft_model=/nonexistent/draft.gguf"},
       1,
       "/nonexistent/draft.gguf"},
      {{"--speculative=draft", "--draft_model=" + model, "--draft_layers=4"},
       1,
       "--draft_model and --draft_layers each name a draft model: set one"},
  });
}

}  // namespace
}  // namespace tandem::testing
