#include "client/bench/bench_command.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/bench/daemon_process.h"
#include "client/bench/file_edits.h"
#include "client/bench/report.h"
#include "client/bench/runner.h"
#include "client/bench/scenario.h"
#include "client/bench/targets.h"
#include "client/bench/workload.h"

#ifndef TANDEM_SOURCE_DIR
#define TANDEM_SOURCE_DIR "."
#endif

ABSL_FLAG(std::string, scenario, "",
          "bench: a built-in scenario (chat, long-context, coding-agent, coding-agent-edit, "
          "long-running, crossover) or a scenario JSON file (default chat; crossover with "
          "--sweep_threshold)");
ABSL_FLAG(int, requests, 0, "bench: requests per foreground class (0: until --duration)");
ABSL_FLAG(int, concurrency, 0, "bench: closed-loop clients (overrides the scenario's load)");
ABSL_FLAG(std::vector<std::string>, rate, {},
          "bench: open-loop Poisson arrivals per second; several (1,2,4) sweep the offered load");
ABSL_FLAG(double, duration, 60, "bench: seconds after which no request starts (0: no bound)");
ABSL_FLAG(std::string, json, "", "bench: write the report as JSON here");
ABSL_FLAG(std::string, markdown, "", "bench: write the report as Markdown here");
ABSL_FLAG(std::string, plots, "",
          "bench: render PNG plots (latency CDFs, goodput against load) into this directory "
          "(needs matplotlib: scripts/setup --bench)");
ABSL_FLAG(std::string, peer, "",
          "bench: also drive this peer in the same run: llama-server (its /completion) or "
          "openai (any OpenAI-compatible server's /v1/completions, tandemd's HTTP API included)");
ABSL_FLAG(std::string, peer_server, "127.0.0.1:8080", "bench: the peer's host:port");
ABSL_FLAG(int, pairs, 0,
          "bench: runs per target or configuration, alternating A B, B A ... (0: 5 with a peer, "
          "--configs or a sweep, else 1)");
ABSL_FLAG(int, output_tokens, 0, "bench: fixed output length of the foreground (0: scenario's)");
ABSL_FLAG(double, slo_ttft_ms, 0,
          "bench: your TTFT budget for the foreground classes, ms (0: the scenario's)");
ABSL_FLAG(double, slo_itl_ms, 0,
          "bench: your mean inter-token latency budget for the foreground, ms (0: the scenario's)");
ABSL_FLAG(int64_t, bench_seed, 1, "bench: seed of lengths, prompts and arrivals");
ABSL_FLAG(std::string, trace, "", "bench: replay this trace (JSON lines) instead of arrivals");
ABSL_FLAG(std::string, source_dir, TANDEM_SOURCE_DIR,
          "bench: the repository whose docs and sources are the prompt corpus");
ABSL_FLAG(int, max_inflight, 512, "bench: open loop: most requests in flight at once");
ABSL_FLAG(bool, sweep_threshold, false,
          "bench: start tandemd colocated, always disaggregated and gated (auto), sweep "
          "--output_lengths under the crossover load, print the threshold to use");
ABSL_FLAG(std::string, configs, "",
          "bench: start a tandemd per configuration and run the scenario on each, pair by pair: "
          "\"standard\" (colocated, disaggregated, default) or \"NAME:FLAGS;NAME:FLAGS...\"; the "
          "last is compared with the others");
ABSL_FLAG(std::vector<std::string>, output_lengths, std::vector<std::string>({"16", "64", "256"}),
          "bench: output lengths the threshold sweep measures");
ABSL_FLAG(std::string, model, "",
          "bench: model file for the daemons --sweep_threshold starts; chat-template: the model "
          "whose tokenizer and template render the conversation");
ABSL_FLAG(std::string, tandemd, "", "bench: tandemd binary for the sweep (default: beside tandem)");
ABSL_FLAG(std::string, daemon_flags, "", "bench: extra flags for the sweep's daemons");
ABSL_FLAG(
    std::string, python, "",
    "bench: Python with matplotlib for --plots (default: scripts/setup --bench's, else python3)");

namespace tandem::bench {
namespace {

std::vector<std::string> SplitList(const std::string& s) {
  return absl::StrSplit(s, ',', absl::SkipEmpty());
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Waits until the target answers a Tokenize call (the daemon is up).
absl::Status WaitReady(Target& target, double timeout_s) {
  const double deadline = NowSeconds() + timeout_s;
  absl::Status last;
  while (NowSeconds() < deadline) {
    absl::StatusOr<TokenIds> ids = target.Tokenize("hello");
    if (ids.ok()) return absl::OkStatus();
    last = ids.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(target.name(), " is not answering: ", last.message()));
}

// One short request, so weights are paged in and first allocations made
// before anything is measured.
void WarmUp(Target& target, const Corpus& corpus) {
  RequestRecord record;
  Generated output;
  GenerateCall call;
  call.prompt = corpus.Window(0, 32);
  call.max_tokens = 4;
  target.Generate(call, &record, &output);
}

class Bench {
 public:
  Bench(v1::Scenario scenario, RunOptions options, std::string command_line)
      : scenario_(std::move(scenario)), options_(std::move(options)) {
    report_.set_command(std::move(command_line));
  }

  // Tokenizes the corpora the scenario uses and, for file-edit classes,
  // reads and measures the repository's source files; `tokenizer` (tandemd)
  // renders every chat.
  absl::Status LoadCorpora(Target& tokenizer) {
    const std::string source_dir = absl::GetFlag(FLAGS_source_dir);
    std::vector<std::string> names = {"prose"};
    bool edits = false;
    for (const v1::RequestClass& c : scenario_.classes()) {
      if (c.task() == "file-edit") {
        edits = true;
      } else if (c.corpus() == "code") {
        names = {"prose", "code"};
      }
    }
    for (const std::string& name : names) {
      absl::StatusOr<std::string> text = CorpusText(source_dir, name);
      if (!text.ok()) return text.status();
      absl::StatusOr<TokenIds> ids = tokenizer.Tokenize(*text);
      if (!ids.ok()) return ids.status();
      if (ids->size() < 1024) return absl::FailedPreconditionError("the corpus is too short");
      sources_.corpora.emplace(name, Corpus(*std::move(ids)));
    }
    sources_.chat = &tokenizer;
    if (!edits) return absl::OkStatus();
    for (const std::string& path : CodeFilePaths(source_dir)) {
      absl::StatusOr<std::string> text = ReadFile(path);
      if (!text.ok()) return text.status();
      absl::StatusOr<TokenIds> ids = tokenizer.Tokenize(*text);
      if (!ids.ok()) return ids.status();
      sources_.files.push_back({path, *std::move(text), static_cast<int>(ids->size())});
    }
    for (const v1::RequestClass& c : scenario_.classes()) {
      if (c.task() == "file-edit" && EditableFiles(c, sources_.files).empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "class ", c.name(), ": no source file under ", source_dir, " of ",
            c.input_tokens().min(), "-", c.input_tokens().max(), " tokens (use --source_dir)"));
      }
    }
    return absl::OkStatus();
  }

  const Corpus& prose() const { return sources_.corpora.at("prose"); }

  // One measured run of the scenario against `target`.
  v1::RunReport Measure(Target& target, const RunOptions& options, const std::string& config) {
    std::vector<std::string> errors;
    const std::vector<std::string> urls = target.MetricsUrls();
    const client::Metrics before = ScrapeSum(urls, &errors);
    const v1::Scenario effective = EffectiveScenario(scenario_, options);
    std::cerr << absl::StrFormat("run: %s on %s%s\n", effective.name(), target.name(),
                                 config.empty() ? "" : " (" + config + ")");
    const RunResult result = RunScenario(effective, target, sources_, options);
    v1::RunReport run = BuildRunReport(effective, target.name(), result);
    run.set_config(config);
    run.set_output_tokens_override(options.output_tokens);
    if (!urls.empty()) {
      const client::Metrics after = ScrapeSum(urls, &errors);
      if (errors.empty()) {
        for (const v1::ServerHistogram& h : PhaseHistograms(Difference(after, before))) {
          *run.add_server() = h;
        }
      }
    }
    for (const std::string& e : errors) std::cerr << "warning: " << e << "\n";
    const v1::ClassReport& t = run.total();
    std::cerr << absl::StrFormat(
        "  %d requests (%d failed) in %.1f s: goodput %.3f req/s, %.1f output tok/s, TTFT p50 "
        "%.0f ms, ITL p99 %.1f ms\n",
        t.requests(), t.failures(), run.wall_s(), t.goodput_per_s(), t.output_tokens_per_s(),
        t.ttft_ms().p50(), t.itl_ms().p99());
    if (t.edit_file_lines() > 0) {
      std::cerr << absl::StrFormat(
          "  file edits: %d of %d answers ended by the model, %.0f%% of the files' lines kept\n",
          t.stopped(), t.requests() - t.failures(),
          100.0 * static_cast<double>(t.edit_lines_kept()) /
              static_cast<double>(t.edit_file_lines()));
    }
    if (t.drafted_tokens() > 0) {
      std::cerr << absl::StrFormat(
          "  speculation: %d drafted, %d accepted (%.0f%%), %.2f tokens per step\n",
          t.drafted_tokens(), t.accepted_tokens(),
          100.0 * static_cast<double>(t.accepted_tokens()) /
              static_cast<double>(t.drafted_tokens()),
          t.tokens_per_step());
    }
    for (const std::string& e : t.errors()) std::cerr << "  error: " << e << "\n";
    *report_.add_runs() = run;
    return run;
  }

  v1::BenchReport& report() { return report_; }
  const RunOptions& options() const { return options_; }

 private:
  v1::Scenario scenario_;
  RunOptions options_;
  PromptSources sources_;
  v1::BenchReport report_;
};

// Whether always-disaggregated beats colocated at one output length: more
// goodput, or within 2% of it with a lower inter-token p99.
bool DisaggregationPays(double goodput_disagg, double goodput_colocated, double itl_p99_disagg,
                        double itl_p99_colocated) {
  if (goodput_disagg > 1.02 * goodput_colocated) return true;
  if (goodput_disagg < 0.98 * goodput_colocated) return false;
  return itl_p99_disagg < itl_p99_colocated;
}

// A daemon configuration the command starts and measures itself.
struct DaemonConfig {
  std::string name;
  std::vector<std::string> flags;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<Target> target;
};

// "standard" (colocated, disaggregated, default), or
// "NAME:FLAG FLAG...;NAME:..." (a name with no flags: the daemon's defaults).
absl::StatusOr<std::vector<DaemonConfig>> ParseConfigs(const std::string& spec) {
  std::vector<DaemonConfig> configs;
  if (spec == "standard") {
    configs.push_back({"colocated", {"--disagg_output_threshold=off"}, nullptr, nullptr});
    configs.push_back({"disaggregated", {"--disagg_output_threshold=0"}, nullptr, nullptr});
    configs.push_back({"default", {}, nullptr, nullptr});
    return configs;
  }
  for (absl::string_view entry : absl::StrSplit(spec, ';', absl::SkipWhitespace())) {
    const size_t colon = entry.find(':');
    DaemonConfig c;
    c.name = std::string(entry.substr(0, colon));
    if (colon != absl::string_view::npos) {
      c.flags = absl::StrSplit(entry.substr(colon + 1), ' ', absl::SkipWhitespace());
    }
    if (c.name.empty()) {
      return absl::InvalidArgumentError("--configs: an entry has no name (NAME:FLAGS;...)");
    }
    configs.push_back(std::move(c));
  }
  if (configs.size() < 2) {
    return absl::InvalidArgumentError("--configs: give \"standard\" or at least two NAME:FLAGS");
  }
  return configs;
}

// Starts a daemon for each configuration (--model, --tandemd, plus
// --daemon_flags and the configuration's own flags) and waits for each.
absl::Status StartConfigs(std::vector<DaemonConfig>& configs) {
  std::string tandemd = absl::GetFlag(FLAGS_tandemd);
  if (tandemd.empty()) tandemd = ExecutableDir() + "/tandemd";
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) {
    return absl::InvalidArgumentError(
        "--sweep_threshold and --configs start their own daemons: give --model=FILE");
  }
  const std::vector<std::string> extra =
      absl::StrSplit(absl::GetFlag(FLAGS_daemon_flags), ' ', absl::SkipWhitespace());
  for (size_t i = 0; i < configs.size(); ++i) {
    DaemonConfig& c = configs[i];
    std::vector<std::string> flags = extra;
    flags.insert(flags.end(), c.flags.begin(), c.flags.end());
    c.daemon = std::make_unique<DaemonProcess>();
    const std::string log = absl::StrCat("/tmp/tandem-bench-daemon-", ::getpid(), "-", i, ".log");
    if (absl::Status s = c.daemon->Start(tandemd, model, flags, log); !s.ok()) return s;
    c.target = MakeTandemTarget({c.daemon->address()}, {c.daemon->metrics_url()});
    if (absl::Status s = WaitReady(*c.target, 120); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Starts the configurations' daemons, reads the corpora through the first
// and warms every daemon up. Returns an exit code (0: ready).
int PrepareConfigs(Bench& bench, std::vector<DaemonConfig>& configs) {
  if (absl::Status s = StartConfigs(configs); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return absl::IsInvalidArgument(s) ? 2 : 1;
  }
  if (absl::Status s = bench.LoadCorpora(*configs[0].target); !s.ok()) {
    std::cerr << "error: " << s << "\n";
    return 1;
  }
  for (DaemonConfig& c : configs) WarmUp(*c.target, bench.prose());
  return 0;
}

int SweepThreshold(Bench& bench, int pairs) {
  std::vector<DaemonConfig> configs;
  configs.push_back({"colocated", {"--disagg_output_threshold=off"}, nullptr, nullptr});
  configs.push_back({"disaggregated", {"--disagg_output_threshold=0"}, nullptr, nullptr});
  configs.push_back({"gated (auto)", {"--disagg_output_threshold=auto"}, nullptr, nullptr});
  if (const int rc = PrepareConfigs(bench, configs); rc != 0) return rc;

  struct Point {
    int length;
    std::vector<double> goodput[2], itl_p99[2];
  };
  std::vector<Point> points;
  for (const std::string& text : absl::GetFlag(FLAGS_output_lengths)) {
    int length = 0;
    if (!absl::SimpleAtoi(text, &length) || length <= 0) {
      std::cerr << "error: --output_lengths: '" << text << "' is not a positive integer\n";
      return 2;
    }
    Point point{length, {}, {}};
    RunOptions options = bench.options();
    options.output_tokens = length;
    for (int pair = 0; pair < pairs; ++pair) {
      options.seed =
          bench.options().seed + static_cast<uint64_t>(pair) * 1000 + static_cast<uint64_t>(length);
      for (size_t j = 0; j < configs.size(); ++j) {
        // Rotate the order pair by pair, so no configuration always goes first.
        const size_t k = (j + static_cast<size_t>(pair)) % configs.size();
        const v1::RunReport run = bench.Measure(*configs[k].target, options, configs[k].name);
        if (k < 2) {
          point.goodput[k].push_back(run.total().goodput_per_s());
          point.itl_p99[k].push_back(run.total().itl_ms().p99());
        }
      }
    }
    points.push_back(point);
  }
  // The threshold: the shortest swept length from which disaggregation pays
  // at every longer swept length too (-1: it does not pay at the longest).
  std::string table =
      "| output tokens | goodput colocated | goodput disaggregated | ITL p99 "
      "colocated | ITL p99 disaggregated | disaggregation pays |\n"
      "|---:|---:|---:|---:|---:|---|\n";
  std::vector<bool> pays;
  for (const Point& p : points) {
    const double gc = Percentile(p.goodput[0], 0.5), gd = Percentile(p.goodput[1], 0.5);
    const double ic = Percentile(p.itl_p99[0], 0.5), id = Percentile(p.itl_p99[1], 0.5);
    pays.push_back(DisaggregationPays(gd, gc, id, ic));
    absl::StrAppendFormat(&table, "| %d | %.3f | %.3f | %.1f ms | %.1f ms | %s |\n", p.length, gc,
                          gd, ic, id, pays.back() ? "yes" : "no");
  }
  int threshold = -1;
  for (size_t i = points.size(); i-- > 0 && pays[i];) threshold = points[i].length;
  std::string advice;
  if (threshold > 0) {
    advice = absl::StrCat("Disaggregation pays from ", threshold, " output tokens on (medians of ",
                          pairs, " runs each): use --disagg_output_threshold=", threshold, ".");
    bench.report().set_recommended_threshold(threshold);
  } else {
    advice =
        "Disaggregation does not pay at the longest swept length: use "
        "--disagg_output_threshold=off.";
    bench.report().set_recommended_threshold(-1);
  }
  bench.report().set_recommendation(table + "\n" + advice);
  for (DaemonConfig& c : configs) c.daemon->Stop();
  return 0;
}

// Each configuration's daemon runs the scenario, pair by pair in rotating
// order; the last configuration is compared with each of the others.
int CompareConfigs(Bench& bench, std::vector<DaemonConfig> configs, int pairs) {
  if (const int rc = PrepareConfigs(bench, configs); rc != 0) return rc;
  std::vector<std::vector<v1::RunReport>> runs(configs.size());
  for (int pair = 0; pair < pairs; ++pair) {
    RunOptions options = bench.options();
    options.seed = bench.options().seed + static_cast<uint64_t>(pair);
    for (size_t j = 0; j < configs.size(); ++j) {
      const size_t k = (j + static_cast<size_t>(pair)) % configs.size();
      runs[k].push_back(bench.Measure(*configs[k].target, options, configs[k].name));
    }
  }
  const size_t last = configs.size() - 1;
  for (size_t k = 0; k < last; ++k) {
    for (v1::Ratio r : PairRatios(runs[last], runs[k])) {
      r.set_measure(absl::StrCat(configs[last].name, " vs ", configs[k].name, ": ", r.measure()));
      *bench.report().add_ratios() = r;
    }
  }
  for (DaemonConfig& c : configs) c.daemon->Stop();
  return 0;
}

// The benchmark environment scripts/setup --bench makes ($TANDEM_VENV, else
// the default cache's), else python3 from PATH.
std::string DefaultPython() {
  std::string venv;
  if (const char* v = std::getenv("TANDEM_VENV")) {
    venv = v;
  } else if (const char* cache = std::getenv("TANDEM_CACHE")) {
    venv = std::string(cache) + "/venv";
  } else if (const char* home = std::getenv("HOME")) {
    venv = std::string(home) + "/.cache/tandem/venv";
  }
  const std::string python = venv + "/bin/python";
  return !venv.empty() && ::access(python.c_str(), X_OK) == 0 ? python : "python3";
}

int Emit(Bench& bench) {
  const v1::BenchReport& report = bench.report();
  const std::string markdown = ToMarkdown(report);
  std::cout << markdown << std::flush;
  int rc = 0;
  std::string json_path = absl::GetFlag(FLAGS_json);
  const std::string plots = absl::GetFlag(FLAGS_plots);
  if (json_path.empty() && !plots.empty()) json_path = plots + "/report.json";
  if (!plots.empty()) (void)std::system(("mkdir -p '" + plots + "'").c_str());
  if (!json_path.empty()) {
    if (absl::Status s = WriteFile(json_path, ToJson(report)); !s.ok()) {
      std::cerr << "error: " << s << "\n";
      rc = 1;
    }
  }
  if (const std::string md = absl::GetFlag(FLAGS_markdown); !md.empty()) {
    if (absl::Status s = WriteFile(md, markdown); !s.ok()) {
      std::cerr << "error: " << s << "\n";
      rc = 1;
    }
  }
  if (!plots.empty() && rc == 0) {
    std::string python = absl::GetFlag(FLAGS_python);
    if (python.empty()) python = DefaultPython();
    const std::string script = absl::GetFlag(FLAGS_source_dir) + "/bench/plot_bench.py";
    const std::string command =
        absl::StrCat("'", python, "' '", script, "' '", json_path, "' '", plots, "'");
    if (std::system(command.c_str()) != 0) {
      std::cerr << "error: plotting failed (" << command << ")\n";
      rc = 1;
    }
  }
  return rc;
}

}  // namespace

int RunBenchCommand(const std::string& servers, const std::string& metrics,
                    const std::string& command_line) {
  const bool sweep = absl::GetFlag(FLAGS_sweep_threshold);
  std::string name = absl::GetFlag(FLAGS_scenario);
  if (name.empty()) name = sweep ? "crossover" : "chat";
  absl::StatusOr<v1::Scenario> scenario = LoadScenario(name);
  if (!scenario.ok()) {
    std::cerr << "error: " << scenario.status().message() << "\n";
    return 2;
  }
  RunOptions options;
  options.requests = absl::GetFlag(FLAGS_requests);
  options.duration_s = absl::GetFlag(FLAGS_duration);
  options.concurrency = absl::GetFlag(FLAGS_concurrency);
  options.output_tokens = absl::GetFlag(FLAGS_output_tokens);
  options.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_bench_seed));
  options.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  options.slo_ttft_ms = absl::GetFlag(FLAGS_slo_ttft_ms);
  options.slo_itl_ms = absl::GetFlag(FLAGS_slo_itl_ms);
  if (options.slo_ttft_ms < 0 || options.slo_itl_ms < 0) {
    std::cerr << "error: --slo_ttft_ms and --slo_itl_ms must be >= 0\n";
    return 2;
  }
  options.progress = true;
  if (options.requests < 0 || options.duration_s < 0 || options.concurrency < 0 ||
      options.output_tokens < 0 || options.max_inflight <= 0) {
    std::cerr << "error: --requests, --duration, --concurrency and --output_tokens must be >= 0, "
                 "--max_inflight > 0\n";
    return 2;
  }
  if (options.requests == 0 && options.duration_s == 0) {
    std::cerr << "error: give --requests or --duration (the run must end by itself)\n";
    return 2;
  }
  std::vector<double> rates;
  for (const std::string& text : absl::GetFlag(FLAGS_rate)) {
    double r = 0;
    if (!absl::SimpleAtod(text, &r) || r <= 0) {
      std::cerr << "error: --rate: '" << text << "' is not a positive number\n";
      return 2;
    }
    rates.push_back(r);
  }
  if (!rates.empty() && options.concurrency > 0) {
    std::cerr << "error: give --concurrency or --rate, not both\n";
    return 2;
  }
  if (rates.empty()) rates.push_back(0);
  if (const std::string trace = absl::GetFlag(FLAGS_trace); !trace.empty()) {
    absl::StatusOr<std::string> text = ReadFile(trace);
    absl::StatusOr<std::vector<v1::TraceRecord>> records =
        text.ok() ? ParseTrace(*text) : absl::StatusOr<std::vector<v1::TraceRecord>>(text.status());
    if (!records.ok()) {
      std::cerr << "error: --trace=" << trace << ": " << records.status().message() << "\n";
      return 2;
    }
    options.trace = *std::move(records);
  }
  const std::string peer_name = absl::GetFlag(FLAGS_peer);
  if (!peer_name.empty() && peer_name != "llama-server" && peer_name != "openai") {
    std::cerr << "error: --peer: unknown peer '" << peer_name << "' (llama-server, openai)\n";
    return 2;
  }
  int pairs = absl::GetFlag(FLAGS_pairs);
  const bool several = !peer_name.empty() || sweep || !absl::GetFlag(FLAGS_configs).empty();
  if (pairs <= 0) pairs = several ? 5 : 1;

  Bench bench(*scenario, options, command_line);
  if (const std::string spec = absl::GetFlag(FLAGS_configs); !spec.empty()) {
    absl::StatusOr<std::vector<DaemonConfig>> configs = ParseConfigs(spec);
    if (!configs.ok()) {
      std::cerr << "error: " << configs.status().message() << "\n";
      return 2;
    }
    if (sweep || !peer_name.empty()) {
      std::cerr << "error: --configs goes with neither --sweep_threshold nor --peer\n";
      return 2;
    }
    const int rc = CompareConfigs(bench, *std::move(configs), pairs);
    return rc != 0 ? rc : Emit(bench);
  }
  if (sweep) {
    const int rc = SweepThreshold(bench, pairs);
    return rc != 0 ? rc : Emit(bench);
  }
  std::unique_ptr<Target> ours = MakeTandemTarget(SplitList(servers), SplitList(metrics));
  std::unique_ptr<Target> peer;
  if (peer_name == "llama-server") peer = MakeLlamaServerTarget(absl::GetFlag(FLAGS_peer_server));
  if (peer_name == "openai") peer = MakeOpenAiTarget(absl::GetFlag(FLAGS_peer_server), ours.get());
  if (absl::Status s = bench.LoadCorpora(*ours); !s.ok()) {
    std::cerr << "error: " << s.message() << "\n";
    return 1;
  }
  WarmUp(*ours, bench.prose());
  if (peer) WarmUp(*peer, bench.prose());
  for (double rate : rates) {
    RunOptions run_options = options;
    run_options.rate = rate;
    std::vector<v1::RunReport> mine, theirs;
    for (int pair = 0; pair < pairs; ++pair) {
      // Each pair gets prompts of its own (the servers' prefix caches keep
      // what earlier runs left), the same for both targets.
      run_options.seed = options.seed + static_cast<uint64_t>(pair);
      // A B, then B A: neither engine always runs on a warmer machine.
      const bool ours_first = pair % 2 == 0 || !peer;
      for (int turn = 0; turn < (peer ? 2 : 1); ++turn) {
        const bool run_ours = (turn == 0) == ours_first;
        Target& target = run_ours ? *ours : *peer;
        v1::RunReport run = bench.Measure(target, run_options, "");
        (run_ours ? mine : theirs).push_back(run);
      }
    }
    for (v1::Ratio r : PairRatios(mine, theirs)) {
      if (rates.size() > 1) r.set_measure(absl::StrFormat("%s at %.2f req/s", r.measure(), rate));
      *bench.report().add_ratios() = r;
    }
  }
  return Emit(bench);
}

}  // namespace tandem::bench
