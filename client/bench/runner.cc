#include "client/bench/runner.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/bench/file_edits.h"

namespace tandem::bench {
namespace {

void SleepUntil(double t) {
  const double wait = t - NowSeconds();
  if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
}

// Shared state of one run.
class Run {
 public:
  Run(const v1::Scenario& scenario, Target& target, const PromptSources& sources,
      const RunOptions& options)
      : scenario_(scenario),
        target_(target),
        chat_(sources.chat != nullptr ? *sources.chat : target),
        options_(options),
        start_(NowSeconds()) {
    for (const v1::RequestClass& c : scenario_.classes()) {
      const bool edits = c.task() == "file-edit";
      // A file-edit class cuts nothing from a corpus: its builder is unused.
      const std::string name = c.corpus().empty() || edits ? "prose" : c.corpus();
      builders_.emplace_back(sources.corpora.at(name), c, options.seed);
      editable_.push_back(edits ? EditableFiles(c, sources.files)
                                : std::vector<const SourceFile*>());
      issued_.push_back(std::make_unique<std::atomic<int64_t>>(0));
      sessions_.push_back(std::make_unique<std::atomic<int64_t>>(0));
    }
    // Trace prompts given as text are tokenized before the run starts.
    for (size_t i = 0; i < options.trace.size(); ++i) {
      if (options.trace[i].prompt().empty()) continue;
      absl::StatusOr<TokenIds> ids = target.Tokenize(options.trace[i].prompt());
      traced_prompts_[static_cast<int64_t>(i)] = ids.ok() ? *ids : TokenIds{1};
    }
  }

  RunResult Execute() {
    std::vector<std::thread> drivers;
    for (int k = 0; k < scenario_.classes_size(); ++k) {
      const v1::RequestClass& c = scenario_.classes(k);
      if (!c.background()) ++foreground_drivers_;
      if (c.concurrency() > 0) {
        if (!c.background()) foreground_drivers_ += c.concurrency() - 1;
        for (int i = 0; i < c.concurrency(); ++i) drivers.emplace_back([this, k] { Client(k); });
      } else {
        drivers.emplace_back([this, k] { OpenLoop(k); });
      }
    }
    std::thread progress;
    if (options_.progress) progress = std::thread([this] { Progress(); });
    for (std::thread& t : drivers) t.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
    }
    cv_.notify_all();
    if (progress.joinable()) progress.join();
    RunResult result;
    result.records = std::move(records_);
    double last = start_;
    for (RequestRecord& r : result.records) {
      if (!scenario_.classes(r.class_index).background()) last = std::max(last, r.end);
      r.start -= start_;
      r.end -= start_;
      for (double& t : r.token_times) t -= start_;
    }
    result.wall_s = last - start_;
    return result;
  }

 private:
  bool TimeUp() const {
    return options_.duration_s > 0 && NowSeconds() - start_ >= options_.duration_s;
  }
  bool ForegroundDone() const { return foreground_done_.load() >= foreground_drivers_; }
  // A foreground client or arrival process has issued its last request:
  // background arrival processes waiting for their next arrival re-check.
  void MarkForegroundDriverDone() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++foreground_done_;
    }
    cv_.notify_all();
  }

  // Claims the right to issue one more request of class k.
  bool Claim(int k) {
    const v1::RequestClass& c = scenario_.classes(k);
    if (c.background()) return !ForegroundDone() && !TimeUp();
    if (TimeUp()) return false;
    const int64_t n = issued_[k]->fetch_add(1);
    return options_.requests <= 0 || n < options_.requests;
  }

  // One request of class k (`call`'s prompt and max_tokens set; the class
  // sets the rest), recorded; what it generated goes to `output`.
  // `annotate`, if given, adds to the record what the answer says.
  void Issue(int k, double start, GenerateCall call, Generated* output,
             const std::function<void(const Generated&, RequestRecord&)>& annotate = nullptr) {
    RequestRecord record;
    record.class_index = k;
    record.start = start;
    call.workload = scenario_.classes(k).workload();
    call.slo_ttft_ms = scenario_.classes(k).slo_ttft_ms();
    call.slo_tpot_ms = scenario_.classes(k).slo_itl_ms();
    call.timeout_s = options_.request_timeout_s;
    target_.Generate(call, &record, output);
    record.end = NowSeconds();
    if (annotate) annotate(*output, record);
    Record(std::move(record));
  }

  // A request of class k that could not be sent.
  void Fail(int k, double start, const absl::Status& why) {
    RequestRecord record;
    record.class_index = k;
    record.start = start;
    record.end = NowSeconds();
    record.error = std::string(why.message());
    Record(std::move(record));
  }

  void Record(RequestRecord record) {
    const int k = record.class_index;
    std::lock_guard<std::mutex> lock(mu_);
    records_.push_back(std::move(record));
    if (!scenario_.classes(k).background()) ++foreground_completed_;
  }

  // The most a file-edit answer may take: the file with room for its change
  // (1.25x + 64), at most the class's output_tokens.max; --output_tokens
  // overrides.
  int EditAnswerCap(const v1::RequestClass& c, const SourceFile& file) const {
    if (options_.output_tokens > 0) return options_.output_tokens;
    int cap = file.tokens + file.tokens / 4 + 64;
    if (c.output_tokens().max() > 0) cap = std::min(cap, c.output_tokens().max());
    return cap;
  }

  // The id the turns of a session of class k share, so that a balancer
  // keeps them on one daemon; "" for a single request. Unique within the run
  // and across runs of other seeds. A header value: the class name's
  // characters other than letters, digits, '-', '_' and '.' become '_'.
  std::string SessionId(int k, int64_t session, int turns) const {
    if (turns <= 1) return "";
    std::string name = scenario_.classes(k).name();
    for (char& c : name) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
        c = '_';
      }
    }
    return absl::StrCat(name, "-", options_.seed, "-", session);
  }

  // A file-edit session of class k: each turn sends the file as it stands
  // (the first turn the repository's, later turns the code of the previous
  // answer) in a new conversation rendered by the chat template, and asks
  // for one change.
  void EditSession(int k, int64_t session, double start) {
    const v1::RequestClass& c = scenario_.classes(k);
    const std::vector<const SourceFile*>& files = editable_[k];
    if (files.empty()) {
      Fail(k, start,
           absl::FailedPreconditionError(absl::StrCat(
               "class ", c.name(), ": no source file of ", c.input_tokens().min(), "-",
               c.input_tokens().max(), " tokens to edit (is --source_dir the repository?)")));
      return;
    }
    const SourceFile& file =
        *files[static_cast<size_t>(options_.seed + static_cast<uint64_t>(session)) % files.size()];
    std::string code = file.text;
    const int turns = std::max(c.turns(), 1);
    for (int turn = 0; turn < turns; ++turn) {
      if (turn > 0 && !Claim(k)) return;
      const std::string instruction = EditInstruction(code, static_cast<int>(session) + turn);
      absl::StatusOr<TokenIds> prompt =
          chat_.TokenizeChat({{"user", FirstEditMessage(code, instruction)}});
      if (turn > 0) start = NowSeconds();
      if (!prompt.ok()) {
        Fail(k, start, prompt.status());
        return;
      }
      GenerateCall call;
      call.prompt = *std::move(prompt);
      call.session_id = SessionId(k, session, turns);
      call.max_tokens = EditAnswerCap(c, file);
      call.stop_at_end = true;
      call.want_text = true;
      Generated output;
      std::string answer_code;
      Issue(k, start, std::move(call), &output,
            [&](const Generated& answer, RequestRecord& record) {
              answer_code = AnswerCode(answer.text);
              // Against the repository's file: a turn's edits change a few
              // of its lines; an answer that loops on the last one keeps none.
              const LinesKept kept = CountLinesKept(file.text, answer_code);
              record.edit_file_lines = kept.lines;
              record.edit_lines_kept = kept.kept;
            });
      code = std::move(answer_code);
    }
  }

  // A session (or a single request when turns <= 1) of class k, started at `start`.
  void Session(int k, int64_t session, double start) {
    const v1::RequestClass& c = scenario_.classes(k);
    if (c.task() == "file-edit") {
      EditSession(k, session, start);
      return;
    }
    std::mt19937_64 rng(options_.seed * 1000003 + static_cast<uint64_t>(session) * 7919 + k);
    TokenIds context = builders_[k].Prompt(session, DrawLength(c.input_tokens(), rng));
    const int turns = std::max(c.turns(), 1);
    for (int turn = 0; turn < turns; ++turn) {
      if (turn > 0) {
        if (!Claim(k)) return;
        const TokenIds more =
            builders_[k].TurnInput(session, turn, DrawLength(c.turn_input_tokens(), rng));
        context.insert(context.end(), more.begin(), more.end());
        start = NowSeconds();
      }
      GenerateCall call;
      call.prompt = context;
      call.session_id = SessionId(k, session, turns);
      call.max_tokens = DrawLength(c.output_tokens(), rng);
      Generated output;
      Issue(k, start, std::move(call), &output);
      context.insert(context.end(), output.ids.begin(), output.ids.end());
    }
  }

  void Client(int k) {
    while (Claim(k)) Session(k, sessions_[k]->fetch_add(1), NowSeconds());
    if (!scenario_.classes(k).background()) MarkForegroundDriverDone();
  }

  void OpenLoop(int k) {
    const v1::RequestClass& c = scenario_.classes(k);
    std::vector<std::thread> inflight;
    int running = 0;  // guarded by slot_mu
    std::mutex slot_mu;
    std::condition_variable slot_cv;
    const bool traced = !options_.trace.empty();
    const int planned = traced ? static_cast<int>(options_.trace.size()) : 0;
    std::mt19937_64 rng(options_.seed * 31 + k);
    std::exponential_distribution<double> gap(c.rate());
    double due = start_;
    for (int64_t i = 0;; ++i) {
      if (traced) {
        if (i >= planned) break;
        due = start_ + options_.trace[i].arrival_s();
      } else {
        due += gap(rng);
      }
      // Wait for the arrival, waking early if the run ends.
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, due - NowSeconds())),
                     [&] { return finished_ || (c.background() && ForegroundDone()); });
      }
      if (c.background() && ForegroundDone()) break;
      SleepUntil(due);
      if (!Claim(k)) break;
      {
        std::unique_lock<std::mutex> lock(slot_mu);
        slot_cv.wait(lock, [&] { return running < options_.max_inflight; });
        ++running;
      }
      inflight.emplace_back([this, k, i, due, traced, &running, &slot_mu, &slot_cv] {
        if (traced) {
          const v1::TraceRecord& t = options_.trace[i];
          GenerateCall call;
          call.prompt =
              t.prompt().empty() ? builders_[k].Prompt(i, t.input_tokens()) : traced_prompts_.at(i);
          call.max_tokens = t.output_tokens();
          Generated output;
          Issue(k, due, std::move(call), &output);
        } else {
          Session(k, i, due);
        }
        std::lock_guard<std::mutex> lock(slot_mu);
        --running;
        slot_cv.notify_one();
      });
    }
    if (!c.background()) MarkForegroundDriverDone();
    for (std::thread& t : inflight) t.join();
  }

  void Progress() {
    const bool tty = isatty(STDERR_FILENO);
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(tty ? 250 : 10000),
                         [&] { return finished_; })) {
      const double elapsed = NowSeconds() - start_;
      std::string line = absl::StrFormat("  %s: %lld requests done, %.0f s", scenario_.name(),
                                         static_cast<long long>(foreground_completed_), elapsed);
      if (options_.requests > 0) {
        int64_t total = 0;
        for (const v1::RequestClass& c : scenario_.classes()) {
          if (!c.background()) total += options_.requests;
        }
        const int width = 30;
        const int filled =
            static_cast<int>(width * std::min<int64_t>(foreground_completed_, total) / total);
        line = absl::StrFormat("  %s [%s%s] %lld/%lld requests, %.0f s", scenario_.name(),
                               std::string(filled, '#'), std::string(width - filled, ' '),
                               static_cast<long long>(foreground_completed_),
                               static_cast<long long>(total), elapsed);
      }
      std::fprintf(stderr, tty ? "\r%s" : "%s\n", line.c_str());
    }
    if (tty) std::fprintf(stderr, "\r%*s\r", 80, "");
  }

 private:
  const v1::Scenario& scenario_;
  Target& target_;
  Target& chat_;  // renders file-edit conversations
  const RunOptions& options_;
  const double start_;
  std::vector<PromptBuilder> builders_;
  std::vector<std::vector<const SourceFile*>> editable_;  // by class (file-edit)
  std::vector<std::unique_ptr<std::atomic<int64_t>>> issued_;
  std::vector<std::unique_ptr<std::atomic<int64_t>>> sessions_;
  std::map<int64_t, TokenIds> traced_prompts_;  // by trace line
  int foreground_drivers_ = 0;
  std::atomic<int> foreground_done_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  std::vector<RequestRecord> records_;
  int64_t foreground_completed_ = 0;
};

}  // namespace

namespace {
void ApplySloBudget(const RunOptions& options, v1::RequestClass& c) {
  if (options.slo_ttft_ms > 0) c.set_slo_ttft_ms(options.slo_ttft_ms);
  if (options.slo_itl_ms > 0) c.set_slo_itl_ms(options.slo_itl_ms);
}
}  // namespace

v1::Scenario EffectiveScenario(const v1::Scenario& scenario, const RunOptions& options) {
  v1::Scenario s = scenario;
  if (!options.trace.empty()) {
    v1::RequestClass c = s.classes(0);
    c.set_name("trace");
    c.set_concurrency(0);
    c.set_rate(1);  // arrivals come from the trace
    c.set_turns(0);
    c.set_task("");  // a trace gives each request's prompt and length
    c.set_background(false);
    ApplySloBudget(options, c);
    s.clear_classes();
    *s.add_classes() = c;
    return s;
  }
  for (v1::RequestClass& c : *s.mutable_classes()) {
    if (c.background()) continue;
    if (options.concurrency > 0) {
      c.set_concurrency(options.concurrency);
      c.set_rate(0);
    } else if (options.rate > 0) {
      c.set_rate(options.rate);
      c.set_concurrency(0);
    }
    if (options.output_tokens > 0) {
      // Exactly this length: no spread, and no clamp to the scenario's range.
      v1::Lengths& out = *c.mutable_output_tokens();
      out.set_median(options.output_tokens);
      out.set_sigma(0);
      out.set_min(0);
      out.set_max(0);
    }
    ApplySloBudget(options, c);
  }
  return s;
}

RunResult RunScenario(const v1::Scenario& scenario, Target& target, const PromptSources& sources,
                      const RunOptions& options) {
  Run run(scenario, target, sources, options);
  return run.Execute();
}

std::vector<const SourceFile*> EditableFiles(const v1::RequestClass& request_class,
                                             const std::vector<SourceFile>& files) {
  const v1::Lengths& bounds = request_class.input_tokens();
  std::vector<const SourceFile*> editable;
  for (const SourceFile& f : files) {
    if (f.tokens >= bounds.min() && (bounds.max() <= 0 || f.tokens <= bounds.max())) {
      editable.push_back(&f);
    }
  }
  return editable;
}

v1::RunReport BuildRunReport(const v1::Scenario& effective, const std::string& target,
                             const RunResult& result) {
  v1::RunReport report;
  report.set_scenario(effective.name());
  report.set_target(target);
  report.set_wall_s(result.wall_s);
  std::vector<const RequestRecord*> foreground;
  double slo_ttft = 0, slo_itl = 0;
  for (int k = 0; k < effective.classes_size(); ++k) {
    const v1::RequestClass& c = effective.classes(k);
    std::vector<const RequestRecord*> mine;
    for (const RequestRecord& r : result.records) {
      if (r.class_index == k) mine.push_back(&r);
    }
    if (!c.background()) {
      foreground.insert(foreground.end(), mine.begin(), mine.end());
      if (report.concurrency() == 0 && report.rate() == 0) {
        report.set_concurrency(c.concurrency());
        report.set_rate(c.rate());
        slo_ttft = c.slo_ttft_ms();
        slo_itl = c.slo_itl_ms();
      }
    }
    *report.add_classes() =
        ReportClass(c.name(), c.background(), c.slo_ttft_ms(), c.slo_itl_ms(), mine, result.wall_s);
  }
  // The total judges each request by its own class's SLOs.
  v1::ClassReport total = ReportClass("total", false, slo_ttft, slo_itl, foreground, result.wall_s);
  int64_t good = 0;
  for (const v1::ClassReport& c : report.classes()) {
    if (!c.background()) good += c.good();
  }
  total.set_good(good);
  total.set_goodput_per_s(result.wall_s > 0 ? static_cast<double>(good) / result.wall_s : 0);
  *report.mutable_total() = total;
  report.set_prefix_hit_ratio(total.prompt_tokens() > 0
                                  ? static_cast<double>(total.cached_prompt_tokens()) /
                                        static_cast<double>(total.prompt_tokens())
                                  : 0);
  return report;
}

}  // namespace tandem::bench
