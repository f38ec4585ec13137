// tandem-spec-bench: decode speed with speculative decoding off, n-gram,
// suffix and the layer-skip self-draft, on a code-editing workload (the prompt holds a
// 300-line source file and asks for it back with a small change), whole-file
// edits of ten repository files (edits: a rename, an added parameter or a
// changed literal), a chat workload, and agent sessions (the code edit, then --session_turns - 1
// more turns that each send the conversation so far and ask for another edit of the whole file;
// figures from turn 2 on), at several batch sizes (sessions: one at a time). In-process
// (ServingModel + Scheduler, no gRPC), so the figures are the engine's and the scheduler's.
//
// Modes: off, ngram, suffix (with the cache of finished requests' text,
// emptied before each run), suffix-own (each request's own tokens only),
// draft (the self-draft).
//
// For each workload, batch size and mode it prints the per-request decode
// speed (tokens after the first / time from first to last token), its ratio
// to "off" measured in the same run, the drafted and accepted tokens, and
// whether the greedy tokens equal those of "off" (they must). With
// --rounds >= 2 it also gives the median, min and max of the per-round
// ratios (each round runs every mode once, "off" first).
//
//   build/bin/tandem-spec-bench --batches=1,2,4,8
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/bench/file_edits.h"
#include "engine/kernels/cpu/matmul.h"
#include "scheduler/scheduler.h"
#include "server/serving_model.h"

ABSL_FLAG(std::string, model, "models/SmolLM2-135M-Instruct.Q4_1.gguf", "GGUF model file");
ABSL_FLAG(int, threads, 2, "CPU threads of the (single, colocated) worker");
ABSL_FLAG(std::string, cpu_matmul, "auto",
          "CPU matmul mode: auto (the daemon's default), f32, bf16 or q8");
ABSL_FLAG(std::string, code_file, "scheduler/scheduler_core.cc",
          "source file whose first --code_lines lines the code-editing prompt holds");
ABSL_FLAG(int, code_lines, 300, "lines of --code_file in the prompt");
ABSL_FLAG(bool, code_fence, true,
          "the assistant's answer to a code-editing request opens with the code fence, as agent "
          "harnesses prefill it (false: the model writes its own opening)");
ABSL_FLAG(int, code_tokens, 256, "max_tokens of a code-editing request");
ABSL_FLAG(int, chat_tokens, 128, "max_tokens of a chat request");
ABSL_FLAG(std::vector<std::string>, batches, std::vector<std::string>({"1", "8"}),
          "concurrent requests per run");
ABSL_FLAG(std::vector<std::string>, modes, std::vector<std::string>({"off", "ngram", "draft"}),
          "speculation modes to compare (off always runs first: the peer)");
ABSL_FLAG(std::vector<std::string>, workloads, std::vector<std::string>({"code", "chat"}),
          "workloads: code, chat, session, edits");
ABSL_FLAG(
    std::vector<std::string>, edit_files,
    std::vector<std::string>({"scheduler/fault_injection.cc", "server/forced_tool_call.cc",
                              "server/grpc_auth.cc", "engine/speculative/draft_rounds.cc",
                              "server/grpc_server.cc", "engine/speculative/draft_model_proposer.cc",
                              "scheduler/speculation_policy.cc", "engine/speculative/verify.cc",
                              "scheduler/step_dispatcher.cc", "scheduler/step_time_model.cc"}),
    "source files of the edits workload (500-2,000 tokens each), one request each");
ABSL_FLAG(int, edit_tokens, 768, "max_tokens of an edits request");
ABSL_FLAG(int, session_turns, 5, "turns of a session (workload session)");
ABSL_FLAG(int64_t, speculation_cache_bytes, int64_t{64} << 20,
          "the suffix cache's budget (mode suffix)");
ABSL_FLAG(double, suffix_length_factor, 0,
          "suffix drafts of at most this times the tokens the copy agrees with (0: no bound)");
ABSL_FLAG(int, draft_layers, 20, "layers of the self-draft (mode draft)");
ABSL_FLAG(int, max_draft, 8, "drafted tokens per sequence and step, at most");
ABSL_FLAG(bool, adaptive, true, "adaptive draft lengths (as the daemon runs by default)");
ABSL_FLAG(bool, print_outputs, false, "print each run's first output (to stderr)");
ABSL_FLAG(int, rounds, 2,
          "runs of every mode, interleaved (off, ngram, draft, off, ...); figures are summed, "
          "so slow spells of a shared machine hit every mode alike");
ABSL_FLAG(int, batch1_requests, 3, "requests run one after another for batch size 1");

namespace tandem {
namespace {

using scheduler::Request;

// Whole-file edits (workload edits): request i asks for the whole of file
// i back with the change bench::EditInstruction gives for kind i % 3.
using bench::EditInstruction;
using bench::FirstEditMessage;

// Small edits an agent asks for; each request of a batch gets its own.
constexpr const char* kEdits[] = {
    "Add the line `// Reviewed by Alice.` at the very top",
    "Add the line `// Copyright 2026 Tandem.` at the very top",
    "Add the line `// Do not edit by hand.` at the very top",
    "Add the line `// Reviewed by Bob.` at the very top",
    "Add the line `// Part of the scheduler.` at the very top",
    "Add the line `// See docs/architecture.md.` at the very top",
    "Add the line `// Owner: serving team.` at the very top",
    "Add the line `// Last reviewed in November.` at the very top",
};

constexpr const char* kChats[] = {
    "Write a short story about a lighthouse keeper.",
    "Explain how a refrigerator works.",
    "What should I pack for a week of hiking?",
    "Describe the water cycle for a ten-year-old.",
    "Give me five tips for better sleep.",
    "Why do leaves change color in autumn?",
    "Write a poem about the sea.",
    "How does a bicycle stay upright?",
};

struct Result {
  std::vector<int32_t> tokens;
  scheduler::FinishInfo info;
};

class Sink : public scheduler::RequestSink {
 public:
  bool OnToken(int32_t token, bool, const step::TokenLogprobs*) override {
    result_.tokens.push_back(token);
    return false;
  }
  void OnFinish(const scheduler::FinishInfo& info) override {
    result_.info = info;
    done_.Notify();
  }
  Result Wait() {
    done_.WaitForNotification();
    return result_;
  }

 private:
  Result result_;
  absl::Notification done_;
};

struct Figures {
  double decode_tokens = 0;   // tokens after each request's first
  double decode_seconds = 0;  // summed over requests
  double wall_seconds = 0;    // first first token to last finish, per batch, summed
  int64_t drafted = 0;
  int64_t accepted = 0;
  std::vector<std::vector<int32_t>> outputs;
  double PerRequest() const { return decode_seconds > 0 ? decode_tokens / decode_seconds : 0; }
  double Total() const { return wall_seconds > 0 ? decode_tokens / wall_seconds : 0; }
};

step::Proposer ParseMode(const std::string& mode) {
  if (mode == "ngram") return step::Proposer::kNgram;
  if (mode == "suffix" || mode == "suffix-own") return step::Proposer::kSuffix;
  if (mode == "draft") return step::Proposer::kDraftModel;
  if (mode == "off") return step::Proposer::kNone;
  std::fprintf(stderr, "unknown mode '%s' (off, ngram, suffix, suffix-own, draft)\n", mode.c_str());
  std::exit(2);
}

class Bench {
 public:
  explicit Bench(server::ServingModel* model) : model_(model) {}

  std::vector<int32_t> Chat(const std::string& text) const {
    const std::vector<tokenizer::ChatMessage> messages = {{"user", text}};
    return *model_->chat_template().Encode(model_->tokenizer(), messages);
  }

  Request Greedy(std::vector<int32_t> prompt, int32_t max_tokens) const {
    Request r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    const tokenizer::SpecialTokens& special = model_->tokenizer().special();
    for (const auto& id : {special.eos, special.eot}) {
      if (id.has_value()) r.stop_token_ids.push_back(*id);
    }
    return r;
  }

  // Runs the requests in groups of `batch` concurrent ones on a scheduler
  // speculating as `mode`.
  Figures RunBatches(const std::string& mode, const std::vector<Request>& requests, int batch) {
    scheduler::Scheduler s(Options(mode), 1024, model_->prefill_worker());
    // Every prompt is prefilled (into the prefix cache) before timing, so a
    // timed batch decodes together instead of waiting on its own prefills.
    {
      std::vector<std::shared_ptr<Sink>> warm;
      for (const Request& r : requests) warm.push_back(Submit(s, Greedy(r.prompt, 1)));
      for (auto& sink : warm) sink->Wait();
    }
    ClearCache();  // of the warm-up's texts
    Figures f;
    for (size_t first = 0; first < requests.size(); first += static_cast<size_t>(batch)) {
      std::vector<std::shared_ptr<Sink>> sinks;
      for (size_t i = first; i < std::min(requests.size(), first + batch); ++i) {
        sinks.push_back(Submit(s, requests[i]));
      }
      absl::Time start = absl::InfiniteFuture(), end = absl::InfinitePast();
      for (auto& sink : sinks) {
        const Result r = sink->Wait();
        const scheduler::Timeline& t = r.info.timeline;
        start = std::min(start, t.first_token);
        end = std::max(end, t.finished);
        f.decode_tokens += static_cast<double>(r.tokens.size()) - 1;
        f.decode_seconds += absl::ToDoubleSeconds(t.finished - t.first_token);
        f.drafted += r.info.usage.drafted_tokens;
        f.accepted += r.info.usage.accepted_tokens;
        f.outputs.push_back(r.tokens);
      }
      f.wall_seconds += absl::ToDoubleSeconds(end - start);
    }
    ReportStepTime(mode, s);
    return f;
  }

  // What the scheduler's step-time model (which the draft policy asks)
  // learned over the run, on stderr.
  static void ReportStepTime(const std::string& mode, const scheduler::Scheduler& s) {
    const scheduler::SchedulerLoad load = s.Load();
    std::fprintf(stderr, "# %s: step time after the run %s\n", mode.c_str(),
                 scheduler::DescribeStepTime(load.step_time, load.step_time_error).c_str());
  }

  // Each session's turns one after another: turn 1 is the session's first
  // request; each later turn sends the conversation so far (its answers
  // opened with the code fence, as prefilled) and the next instruction.
  // Figures count turns 2 and later.
  Figures RunSessions(const std::string& mode,
                      const std::vector<std::vector<std::string>>& sessions, int32_t max_tokens) {
    ClearCache();
    scheduler::Scheduler s(Options(mode), 1024, model_->prefill_worker());
    Figures f;
    for (const std::vector<std::string>& turns : sessions) {
      std::vector<tokenizer::ChatMessage> messages;
      for (size_t turn = 0; turn < turns.size(); ++turn) {
        messages.push_back({"user", turns[turn]});
        std::vector<int32_t> prompt =
            *model_->chat_template().Encode(model_->tokenizer(), messages);
        for (int32_t t : model_->tokenizer().Encode(kFence, false)) prompt.push_back(t);
        const Result r = Submit(s, Greedy(std::move(prompt), max_tokens))->Wait();
        messages.push_back(
            {"assistant", std::string(kFence) + model_->tokenizer().Decode(r.tokens, true)});
        f.outputs.push_back(r.tokens);
        if (turn == 0) continue;
        const scheduler::Timeline& t = r.info.timeline;
        f.decode_tokens += static_cast<double>(r.tokens.size()) - 1;
        f.decode_seconds += absl::ToDoubleSeconds(t.finished - t.first_token);
        f.wall_seconds += absl::ToDoubleSeconds(t.finished - t.first_token);
        f.drafted += r.info.usage.drafted_tokens;
        f.accepted += r.info.usage.accepted_tokens;
      }
    }
    ReportStepTime(mode, s);
    return f;
  }

  static constexpr const char* kFence = "```cpp\n";

 private:
  void ClearCache() {
    if (model_->suffix_cache() != nullptr) model_->suffix_cache()->Clear();
  }

  scheduler::SchedulerOptions Options(const std::string& mode) const {
    scheduler::SchedulerOptions options;
    options.max_batched_tokens = 512;
    options.block_size = model_->block_size();
    options.kv_blocks = model_->kv_blocks();
    options.context_length = model_->context_length();
    options.speculation.proposer = ParseMode(mode);
    options.speculation.max_draft = absl::GetFlag(FLAGS_max_draft);
    options.speculation.adaptive = absl::GetFlag(FLAGS_adaptive);
    options.speculation.draft_cost = model_->step_costs().draft;
    options.step_time_prior = model_->step_costs().linear;
    options.row_curve = model_->step_costs().rows;
    if (mode == "suffix") options.on_finished_text = model_->SuffixCacheFeed();
    return options;
  }

  std::shared_ptr<Sink> Submit(scheduler::Scheduler& s, Request r) {
    auto sink = std::make_shared<Sink>();
    r.sink = sink;
    if (!s.Submit(std::move(r)).ok()) {
      std::fprintf(stderr, "submit failed\n");
      std::exit(1);
    }
    return sink;
  }

  server::ServingModel* model_;
};

std::string FileHead(const std::string& path, int lines) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read --code_file=%s\n", path.c_str());
    std::exit(2);
  }
  std::string line, text;
  for (int i = 0; i < lines && std::getline(in, line); ++i) text += line + "\n";
  return text;
}

int Main() {
  const absl::StatusOr<kernels::cpu::MatMulMode> matmul_mode =
      kernels::cpu::ParseMatMulMode(absl::GetFlag(FLAGS_cpu_matmul));
  if (!matmul_mode.ok()) {
    std::fprintf(stderr, "--cpu_matmul: %s\n", std::string(matmul_mode.status().message()).c_str());
    return 2;
  }
  server::ServingModelOptions options;
  options.model_path = absl::GetFlag(FLAGS_model);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.matmul_mode = *matmul_mode;
  options.decode_worker = false;
  options.kv_cache_bytes = int64_t{1} << 30;
  options.draft_layers = absl::GetFlag(FLAGS_draft_layers);
  options.speculation_cache_bytes = absl::GetFlag(FLAGS_speculation_cache_bytes);
  options.suffix_length_factor = absl::GetFlag(FLAGS_suffix_length_factor);
  auto model = server::ServingModel::Load(options);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  Bench bench(model->get());
  const server::StepCosts& c = (*model)->step_costs();
  std::printf(
      "model %s, %d threads, --cpu_matmul=%s, step time %s, row curve %s, self-draft %d layers "
      "(%.2f ms + %.2f ms/sequence a round), max draft %d, %s, suffix length factor %.2f, suffix "
      "cache %lld bytes\n",
      options.model_path.c_str(), options.threads,
      std::string(kernels::cpu::MatMulModeName(options.matmul_mode)).c_str(),
      scheduler::DescribeStepTime(c.linear, 0).c_str(), c.rows.Describe().c_str(),
      options.draft_layers, c.draft.fixed, c.draft.per_token, absl::GetFlag(FLAGS_max_draft),
      absl::GetFlag(FLAGS_adaptive) ? "adaptive" : "fixed draft length",
      options.suffix_length_factor, static_cast<long long>(options.speculation_cache_bytes));

  const std::string code =
      FileHead(absl::GetFlag(FLAGS_code_file), absl::GetFlag(FLAGS_code_lines));
  std::vector<std::string> modes = absl::GetFlag(FLAGS_modes);
  modes.erase(std::remove(modes.begin(), modes.end(), "off"), modes.end());
  modes.insert(modes.begin(), "off");

  std::printf("%-5s %5s %-6s %10s %7s %11s %7s %8s %8s %6s %5s\n", "work", "batch", "mode",
              "req tok/s", "ratio", "total tok/s", "ratio", "drafted", "accepted", "rate", "same");
  for (const std::string& workload : absl::GetFlag(FLAGS_workloads)) {
    for (const std::string& batch_text : absl::GetFlag(FLAGS_batches)) {
      const int batch = std::stoi(batch_text);
      const int count = batch == 1 ? absl::GetFlag(FLAGS_batch1_requests) : batch;
      std::vector<Request> requests;
      std::vector<std::vector<std::string>> sessions;
      const std::vector<std::string>& edit_files = absl::GetFlag(FLAGS_edit_files);
      std::vector<std::string> edit_sources;  // workload edits: each request's file
      if (workload == "edits") {
        if (batch != 1) continue;  // whole-file edits run one at a time
        std::printf("# edits: one request per file, one at a time, up to %d generated:\n",
                    absl::GetFlag(FLAGS_edit_tokens));
        for (size_t f = 0; f < edit_files.size(); ++f) {
          const std::string file = FileHead(edit_files[f], 1 << 30);
          const std::string instruction = EditInstruction(file, static_cast<int>(f % 3));
          edit_sources.push_back(file);
          std::vector<int32_t> tokens = bench.Chat(FirstEditMessage(file, instruction));
          for (int32_t t : (*model)->tokenizer().Encode("```cpp\n", false)) tokens.push_back(t);
          std::printf("#   %s: %zu tokens of file, %zu of prompt; %s\n", edit_files[f].c_str(),
                      (*model)->tokenizer().Encode(file, false).size(), tokens.size(),
                      instruction.c_str());
          requests.push_back(bench.Greedy(std::move(tokens), absl::GetFlag(FLAGS_edit_tokens)));
        }
      }
      for (int i = 0; i < count && workload != "edits"; ++i) {
        if (workload == "session") {
          std::vector<std::string> turns = {"Here is a source file:\n```cpp\n" + code + "```\n" +
                                            kEdits[i % 8] +
                                            " and return the whole file, otherwise unchanged."};
          for (int turn = 1; turn < absl::GetFlag(FLAGS_session_turns); ++turn) {
            turns.push_back(std::string("Also: ") + kEdits[(i + turn) % 8] +
                            ", and return the whole file again.");
          }
          sessions.push_back(std::move(turns));
          continue;
        }
        if (workload == "code") {
          // The file first (every edit of it shares that prefix, as an
          // agent's successive requests do), then the instruction.
          const std::string prompt = "Here is a source file:\n```cpp\n" + code + "```\n" +
                                     kEdits[i % 8] +
                                     " and return the whole file, otherwise unchanged.";
          std::vector<int32_t> tokens = bench.Chat(prompt);
          if (absl::GetFlag(FLAGS_code_fence)) {
            for (int32_t t : (*model)->tokenizer().Encode("```cpp\n", false)) tokens.push_back(t);
          }
          requests.push_back(bench.Greedy(std::move(tokens), absl::GetFlag(FLAGS_code_tokens)));
        } else {
          requests.push_back(
              bench.Greedy(bench.Chat(kChats[i % 8]), absl::GetFlag(FLAGS_chat_tokens)));
        }
      }
      if (workload == "session" && batch_text == absl::GetFlag(FLAGS_batches)[0]) {
        std::printf(
            "# session: %d sessions of %d turns, one at a time, up to %d generated a turn; "
            "figures from turn 2 on\n",
            count, absl::GetFlag(FLAGS_session_turns), absl::GetFlag(FLAGS_code_tokens));
      } else if (workload == "session") {
        continue;  // sessions run one at a time: one batch size is enough
      } else if (batch_text == absl::GetFlag(FLAGS_batches)[0] && workload != "edits") {
        std::printf("# %s: prompt %zu tokens, up to %d generated\n", workload.c_str(),
                    requests[0].prompt.size(), requests[0].max_tokens);
      }
      std::map<std::string, Figures> figures;
      // Each round's per-request decode speed against that round's "off":
      // the pairs the median and range below come from.
      std::map<std::string, std::vector<double>> round_ratios;
      for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
        double off_speed = 0;
        for (const std::string& mode : modes) {
          const Figures f =
              workload == "session"
                  ? bench.RunSessions(mode, sessions, absl::GetFlag(FLAGS_code_tokens))
                  : bench.RunBatches(mode, requests, batch);
          if (mode == "off") off_speed = f.PerRequest();
          if (off_speed > 0) round_ratios[mode].push_back(f.PerRequest() / off_speed);
          Figures& sum = figures[mode];
          sum.decode_tokens += f.decode_tokens;
          sum.decode_seconds += f.decode_seconds;
          sum.wall_seconds += f.wall_seconds;
          sum.drafted += f.drafted;
          sum.accepted += f.accepted;
          if (sum.outputs.empty()) sum.outputs = f.outputs;
        }
      }
      const Figures& off = figures["off"];
      if (workload == "edits") {
        // Whether the answers are edits of their files at all: the share of
        // the files' lines they reproduce (the fence was prefilled, so an
        // answer's code runs to its first closing fence).
        bench::LinesKept sum;
        for (size_t i = 0; i < edit_sources.size() && i < off.outputs.size(); ++i) {
          const std::string text = (*model)->tokenizer().Decode(off.outputs[i], true);
          const bench::LinesKept kept =
              bench::CountLinesKept(edit_sources[i], text.substr(0, text.find("```")));
          sum.lines += kept.lines;
          sum.kept += kept.kept;
        }
        std::printf("# edits: the answers reproduce %d of their files' %d lines (%.0f%%)\n",
                    sum.kept, sum.lines, sum.lines > 0 ? 100.0 * sum.kept / sum.lines : 0.0);
      }
      for (const std::string& mode : modes) {
        const Figures& f = figures[mode];
        if (absl::GetFlag(FLAGS_print_outputs)) {
          std::fprintf(stderr, "--- %s %s batch %d:\n%s\n---\n", workload.c_str(), mode.c_str(),
                       batch, (*model)->tokenizer().Decode(f.outputs[0], true).c_str());
        }
        const double rate =
            f.drafted > 0 ? 100.0 * static_cast<double>(f.accepted) / static_cast<double>(f.drafted)
                          : 0.0;
        std::printf("%-5s %5d %-6s %10.1f %6.2fx %11.1f %6.2fx %8lld %8lld %5.1f%% %5s\n",
                    workload.c_str(), batch, mode.c_str(), f.PerRequest(),
                    f.PerRequest() / off.PerRequest(), f.Total(), f.Total() / off.Total(),
                    static_cast<long long>(f.drafted), static_cast<long long>(f.accepted), rate,
                    f.outputs == off.outputs ? "yes" : "NO");
        std::vector<double>& ratios = round_ratios[mode];
        if (mode != "off" && ratios.size() > 1) {
          std::sort(ratios.begin(), ratios.end());
          const size_t n = ratios.size();
          const double median =
              n % 2 == 1 ? ratios[n / 2] : (ratios[n / 2 - 1] + ratios[n / 2]) / 2;
          std::printf(
              "      per-request ratio over %zu rounds: median %.2fx (min %.2fx, max %.2fx)\n", n,
              median, ratios.front(), ratios.back());
        }
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::Main();
}
