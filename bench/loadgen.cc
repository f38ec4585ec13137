// tandem-loadgen: drives a running tandemd with a mixed workload and reports,
// per request class, time to first token and inter-token latency (p50/p99,
// measured at the client), plus the generated-token throughput.
//
//   tandem-loadgen --server=127.0.0.1:50051 --seconds=40
//
// Classes (all greedy, ignore_eos, so lengths are exact):
//   long_output  --long_streams concurrent streams, each a ~64-token prompt
//                and --long_output_tokens tokens, restarted as they finish
//                (workload "long-output": the server may learn they are long)
//   long_prompt  a --long_prompt_tokens prompt and 8 output tokens, one every
//                --long_prompt_every seconds (workload "summarize")
//   short_chat   a ~48-token prompt and 24 output tokens, one every
//                --short_every seconds (workload "chat")
// Output: one "key value" line per figure, for scripts.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "tandem/v1/generate.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "tandemd address");
ABSL_FLAG(double, seconds, 40, "measured duration");
ABSL_FLAG(double, warmup, 5, "seconds of load before measuring");
ABSL_FLAG(int, long_streams, 2, "concurrent long-output streams");
ABSL_FLAG(int, long_output_tokens, 128, "tokens per long-output request");
ABSL_FLAG(int, long_prompt_tokens, 512, "prompt tokens of a long-prompt request");
ABSL_FLAG(double, long_prompt_every, 6, "seconds between long-prompt requests (0: none)");
ABSL_FLAG(double, short_every, 2, "seconds between short chat requests (0: none)");

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

struct ClassStats {
  std::vector<double> ttft_ms;
  std::vector<double> itl_ms;
  int64_t tokens = 0;
  int requests = 0;
  int failures = 0;
};

class Recorder {
 public:
  explicit Recorder(Clock::time_point measure_from) : from_(measure_from) {}
  void Add(const std::string& cls, Clock::time_point start,
           const std::vector<Clock::time_point>& token_times, bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    ClassStats& s = stats_[cls];
    if (start < from_) return;  // warm-up
    ++s.requests;
    if (!ok) {
      ++s.failures;
      return;
    }
    s.tokens += static_cast<int64_t>(token_times.size());
    if (token_times.empty()) return;
    s.ttft_ms.push_back(
        std::chrono::duration<double, std::milli>(token_times.front() - start).count());
    for (size_t i = 1; i < token_times.size(); ++i) {
      s.itl_ms.push_back(
          std::chrono::duration<double, std::milli>(token_times[i] - token_times[i - 1]).count());
    }
  }
  std::map<std::string, ClassStats> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  Clock::time_point from_;
  std::mutex mu_;
  std::map<std::string, ClassStats> stats_;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

v1::GenerateRequest MakeRequest(int prompt_tokens, int output_tokens, const std::string& workload,
                                std::mt19937& rng) {
  v1::GenerateRequest r;
  for (int i = 0; i < prompt_tokens; ++i)
    r.add_token_ids(static_cast<uint32_t>(300 + rng() % 30000));
  r.set_max_tokens(output_tokens);
  r.set_ignore_eos(true);
  r.mutable_sampling()->set_temperature(0.0f);
  r.set_workload(workload);
  return r;
}

// Runs one request; records each token's arrival time.
void RunOne(v1::Generation::Stub& stub, const v1::GenerateRequest& request, const std::string& cls,
            Recorder& recorder) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  const Clock::time_point start = Clock::now();
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse response;
  std::vector<Clock::time_point> times;
  while (reader->Read(&response)) {
    const Clock::time_point now = Clock::now();
    for (int i = 0; i < response.token_ids_size(); ++i) times.push_back(now);
  }
  recorder.Add(cls, start, times, reader->Finish().ok());
}

int Run() {
  auto channel =
      grpc::CreateChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials());
  const Clock::time_point begin = Clock::now();
  const auto warmup = std::chrono::duration<double>(absl::GetFlag(FLAGS_warmup));
  const auto measured = std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds));
  const Clock::time_point measure_from =
      begin + std::chrono::duration_cast<Clock::duration>(warmup);
  const Clock::time_point end =
      measure_from + std::chrono::duration_cast<Clock::duration>(measured);
  Recorder recorder(measure_from);
  std::vector<std::thread> threads;

  for (int s = 0; s < absl::GetFlag(FLAGS_long_streams); ++s) {
    threads.emplace_back([&, s] {
      std::mt19937 rng(100 + static_cast<unsigned>(s));
      auto stub = v1::Generation::NewStub(channel);
      while (Clock::now() < end) {
        RunOne(*stub, MakeRequest(64, absl::GetFlag(FLAGS_long_output_tokens), "long-output", rng),
               "long_output", recorder);
      }
    });
  }
  // Open-loop arrivals: each request on its own thread.
  auto arrivals = [&](const std::string& cls, double every, int prompt, int output,
                      const std::string& workload, unsigned seed) {
    if (every <= 0) return;  // class disabled
    std::mt19937 rng(seed);
    std::vector<std::thread> running;
    Clock::time_point next = begin;
    while (next < end) {
      std::this_thread::sleep_until(next);
      v1::GenerateRequest r = MakeRequest(prompt, output, workload, rng);
      running.emplace_back([&, r, cls] {
        auto stub = v1::Generation::NewStub(channel);
        RunOne(*stub, r, cls, recorder);
      });
      next += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(every));
    }
    for (auto& t : running) t.join();
  };
  threads.emplace_back([&] {
    arrivals("long_prompt", absl::GetFlag(FLAGS_long_prompt_every),
             absl::GetFlag(FLAGS_long_prompt_tokens), 8, "summarize", 7);
  });
  threads.emplace_back(
      [&] { arrivals("short_chat", absl::GetFlag(FLAGS_short_every), 48, 24, "chat", 9); });
  for (auto& t : threads) t.join();

  const double seconds = std::chrono::duration<double>(Clock::now() - measure_from).count();
  int64_t tokens = 0;
  for (const auto& [cls, s] : recorder.Take()) {
    tokens += s.tokens;
    std::cout << cls << "_requests " << s.requests << "\n"
              << cls << "_failures " << s.failures << "\n"
              << cls << "_ttft_p50_ms " << Percentile(s.ttft_ms, 0.50) << "\n"
              << cls << "_ttft_p99_ms " << Percentile(s.ttft_ms, 0.99) << "\n"
              << cls << "_itl_p50_ms " << Percentile(s.itl_ms, 0.50) << "\n"
              << cls << "_itl_p99_ms " << Percentile(s.itl_ms, 0.99) << "\n";
  }
  std::cout << "throughput_tokens_per_second " << static_cast<double>(tokens) / seconds << "\n";
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::Run();
}
