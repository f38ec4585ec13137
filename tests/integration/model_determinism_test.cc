// Deterministic serving with the real model: a sequence's logits are bitwise
// the same alone, batched with other sequences, chunked, and on 1 or 2
// threads; and generation through the scheduler gives every request the same
// tokens alone or concurrently, greedy or seeded.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "engine/kernels/cpu/cpu_backend.h"
#include "engine/model/llama_model.h"
#include "engine/prefill/prefill_worker.h"
#include "kvcache/kv_cache_manager.h"
#include "scheduler/scheduler.h"
#include "tests/integration/test_model.h"

namespace tandem {
namespace {

constexpr int kBlockSize = 16;
constexpr int kBlocks = 64;

class ModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_FALSE(testing::TestModelPath().empty()) << "set TANDEM_TEST_MODEL";
    auto file = model::GgufFile::Open(testing::TestModelPath());
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = std::shared_ptr<const model::GgufFile>(*std::move(file));
  }
  static void TearDownTestSuite() { file_.reset(); }

  struct Loaded {
    std::unique_ptr<kernels::Backend> backend;
    std::unique_ptr<model::LlamaModel> model;
  };
  static Loaded Load(int threads) {
    Loaded l;
    l.backend = std::make_unique<kernels::cpu::CpuBackend>(threads);
    auto m = model::LlamaModel::Create(file_, l.backend.get(), kBlocks, kBlockSize);
    EXPECT_TRUE(m.ok()) << m.status();
    l.model = *std::move(m);
    return l;
  }
  static std::vector<int32_t> Prompt(int n, int salt) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(200 + (i * 7919 + salt * 104729) % 40000);
    return t;
  }
  // Runs `tokens` in chunks of `chunk` on blocks [first_block..]; returns the
  // logits of the last token.
  static std::vector<float> Logits(model::LlamaModel& m, const std::vector<int32_t>& tokens,
                                   int chunk, std::vector<int32_t> table) {
    std::vector<float> logits;
    for (size_t pos = 0; pos < tokens.size(); pos += static_cast<size_t>(chunk)) {
      const size_t n = std::min(static_cast<size_t>(chunk), tokens.size() - pos);
      model::SequenceInput in;
      in.tokens = std::span<const int32_t>(tokens.data() + pos, n);
      in.first_position = static_cast<int32_t>(pos);
      in.block_table = table;
      in.logits = pos + n == tokens.size() ? 1 : 0;
      EXPECT_TRUE(m.Forward({&in, 1}, &logits).ok());
    }
    return logits;
  }

  static std::shared_ptr<const model::GgufFile> file_;
};
std::shared_ptr<const model::GgufFile> ModelTest::file_;

TEST_F(ModelTest, LogitsAreBitwiseIdenticalAloneChunkedBatchedAndOnAnyThreadCount) {
  Loaded one = Load(1);
  const std::vector<int32_t> a = Prompt(45, 1), b = Prompt(20, 2), c = Prompt(33, 3);
  const std::vector<int32_t> table_a = {5, 9, 2}, table_b = {11, 12}, table_c = {20, 21, 22};
  const std::vector<float> reference = Logits(*one.model, a, 45, table_a);
  ASSERT_EQ(reference.size(), static_cast<size_t>(one.model->config().vocab));

  for (int chunk : {1, 7, 16, 44}) {
    const std::vector<float> chunked = Logits(*one.model, a, chunk, table_a);
    EXPECT_EQ(std::memcmp(chunked.data(), reference.data(), reference.size() * 4), 0)
        << "chunk size " << chunk;
  }
  // In one batch with two other sequences, `a` in the middle and asking for
  // logits of b's and c's last tokens too.
  Loaded two = Load(2);
  std::vector<model::SequenceInput> batch(3);
  batch[0] = {b, 0, table_b, 1};
  batch[1] = {a, 0, table_a, 1};
  batch[2] = {c, 0, table_c, 1};
  std::vector<float> logits;
  ASSERT_TRUE(two.model->Forward(batch, &logits).ok());
  EXPECT_EQ(std::memcmp(logits.data() + reference.size(), reference.data(), reference.size() * 4),
            0)
      << "batched on 2 threads";
}

TEST_F(ModelTest, ForwardRejectsBadInputsWithoutComputing) {
  Loaded l = Load(1);
  std::vector<float> logits;
  const std::vector<int32_t> table = {0};
  const std::vector<int32_t> bad_token = {1, 999999};
  model::SequenceInput in{bad_token, 0, table, 1};
  absl::Status s = l.model->Forward({&in, 1}, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("999999"), std::string::npos);
  const std::vector<int32_t> ok_tokens(20, 5);
  model::SequenceInput short_table{ok_tokens, 0, table, 1};  // 20 tokens need 2 blocks
  EXPECT_EQ(l.model->Forward({&short_table, 1}, &logits).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> bad_block = {kBlocks};
  in.tokens = std::span<const int32_t>(ok_tokens.data(), 1);
  in.block_table = bad_block;
  EXPECT_EQ(l.model->Forward({&in, 1}, &logits).code(), absl::StatusCode::kInvalidArgument);
}

// A forked sequence reads its shared prefix from the parent's blocks and its
// copied partial block (copy-on-write): its next-token logits equal a fresh
// sequence's, bitwise, while the parent writes its own continuation into the
// original block. Without the copy they differ (checked too).
TEST_F(ModelTest, AForkedSequenceCopiesItsPartlyFilledBlockOnWrite) {
  for (bool apply_copy : {true, false}) {
    Loaded l = Load(2);
    kvcache::KvCacheManager kv(kBlocks, kBlockSize);
    const std::vector<int32_t> prompt = Prompt(20, 7);  // one full block and 4 tokens
    std::vector<float> logits;
    ASSERT_TRUE(kv.Admit(1, "", prompt, {}, 20));
    model::SequenceInput parent{prompt, 0, kv.BlockTable(1), 1};
    ASSERT_TRUE(l.model->Forward({&parent, 1}, &logits).ok());
    kv.Commit(1, prompt, 20);
    kv.Fork(1, 2);

    // One step: the child appends 4242, the parent 1717, both at position 20.
    const std::vector<int32_t> child_token = {4242}, parent_token = {1717};
    ASSERT_TRUE(kv.Reserve(2, 21));
    ASSERT_TRUE(kv.Reserve(1, 21));
    std::vector<std::pair<int32_t, int32_t>> copies;
    for (const kvcache::BlockCopy& c : kv.TakeCopies()) copies.emplace_back(c.from, c.to);
    ASSERT_EQ(copies.size(), 1u);
    if (apply_copy) {
      ASSERT_TRUE(l.model->CopyBlocks(copies).ok());
    }
    std::vector<model::SequenceInput> step = {{child_token, 20, kv.BlockTable(2), 1},
                                              {parent_token, 20, kv.BlockTable(1), 1}};
    std::vector<float> forked;
    ASSERT_TRUE(l.model->Forward(step, &forked).ok());

    std::vector<int32_t> full = prompt;
    full.push_back(child_token[0]);
    ASSERT_TRUE(kv.Admit(3, "other", full, {}, 21));
    model::SequenceInput fresh{full, 0, kv.BlockTable(3), 1};
    std::vector<float> reference;
    ASSERT_TRUE(l.model->Forward({&fresh, 1}, &reference).ok());
    const bool same = std::memcmp(forked.data(), reference.data(), reference.size() * 4) == 0;
    EXPECT_EQ(same, apply_copy) << (apply_copy ? "the copied block lost the prefix"
                                               : "the test cannot see a missing copy");
  }
}

// Collects one request's tokens and waits for its end. At its end it reads
// the scheduler's load: a request's end is announced only after the load
// snapshot stops counting it, so a client that sees its call end and then asks
// for the load sees its slot and blocks returned.
struct Collector : scheduler::RequestSink {
  const scheduler::Scheduler* scheduler = nullptr;
  std::atomic<int>* unfinished = nullptr;  // requests not yet ended, this one included
  std::vector<int32_t> tokens;
  scheduler::FinishInfo info;
  int32_t counted_at_end = -1;        // waiting + running in the load read at the end
  int32_t unfinished_after_end = -1;  // requests still to end after this one
  int32_t kv_used_blocks_at_end = -1;
  absl::Notification done;
  bool OnToken(int32_t token, bool, const step::TokenLogprobs*) override {
    tokens.push_back(token);
    return false;
  }
  void OnFinish(const scheduler::FinishInfo& i) override {
    info = i;
    unfinished_after_end = --*unfinished;
    const scheduler::SchedulerLoad load = scheduler->Load();
    counted_at_end = load.waiting + load.running[0] + load.running[1];
    kv_used_blocks_at_end = load.kv.used_blocks;
    done.Notify();
  }
};

std::vector<std::vector<int32_t>> Generate(step::Worker* worker,
                                           const std::vector<scheduler::Request>& requests,
                                           int32_t budget) {
  scheduler::SchedulerOptions options;
  options.max_batched_tokens = budget;
  options.block_size = kBlockSize;
  options.kv_blocks = kBlocks;
  options.context_length = 2048;
  scheduler::Scheduler s(options, 64, worker);
  std::vector<std::shared_ptr<Collector>> sinks;
  std::atomic<int> unfinished = static_cast<int>(requests.size());
  for (scheduler::Request r : requests) {
    sinks.push_back(std::make_shared<Collector>());
    sinks.back()->scheduler = &s;
    sinks.back()->unfinished = &unfinished;
    r.sink = sinks.back();
    EXPECT_TRUE(s.Submit(std::move(r)).ok());
  }
  std::vector<std::vector<int32_t>> out;
  for (auto& sink : sinks) {
    sink->done.WaitForNotification();
    out.push_back(sink->tokens);
    EXPECT_LE(sink->counted_at_end, sink->unfinished_after_end);
    if (sink->unfinished_after_end == 0) {
      EXPECT_EQ(sink->kv_used_blocks_at_end, 0);
    }
  }
  // Right after the last end the scheduler reads idle. An idle scheduler is
  // never "stalled", however long ago its last step was.
  const scheduler::SchedulerLoad load = s.Load();
  EXPECT_FALSE(load.has_work);
  EXPECT_EQ(load.kv.used_blocks, 0);
  EXPECT_GT(load.last_step_done, absl::Now() - absl::Minutes(1));
  EXPECT_FALSE(scheduler::Stalled(load, absl::Now() + absl::Hours(1), absl::Seconds(60)));
  scheduler::SchedulerLoad busy = load;
  busy.has_work = true;
  EXPECT_FALSE(
      scheduler::Stalled(busy, load.last_step_done + absl::Seconds(59), absl::Seconds(60)));
  EXPECT_TRUE(scheduler::Stalled(busy, load.last_step_done + absl::Seconds(61), absl::Seconds(60)));
  return out;
}

TEST_F(ModelTest, RequestsGetTheSameTokensAloneAndConcurrentlyGreedyAndSeeded) {
  auto backend = std::make_unique<kernels::cpu::CpuBackend>(2);
  auto m = model::LlamaModel::Create(file_, backend.get(), kBlocks, kBlockSize);
  ASSERT_TRUE(m.ok());
  prefill::PrefillWorker worker(std::move(backend), *std::move(m));
  std::vector<scheduler::Request> requests;
  for (int i = 0; i < 4; ++i) {
    scheduler::Request r;
    r.prompt = Prompt(10 + 9 * i, 10 + i);
    r.max_tokens = 12;
    r.sampling.temperature = i % 2 == 0 ? 0.0f : 0.9f;
    r.sampling.top_k = 50;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = 1234 + static_cast<uint64_t>(i);
    requests.push_back(r);
  }
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : requests) alone.push_back(Generate(&worker, {r}, 512)[0]);
  const auto together = Generate(&worker, requests, 512);
  const auto small_budget = Generate(&worker, requests, 7);  // chunked prompts, mixed batches
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(alone[i].size(), 12u);
    EXPECT_EQ(together[i], alone[i]) << "request " << i << " batched";
    EXPECT_EQ(small_budget[i], alone[i]) << "request " << i << " chunked";
  }
}

// Two lanes on one shared compute pool, as in the daemon: a prefill model
// running a long prompt in chunks (throughput lane) while a decode model runs
// decode steps that preempt it (latency lane). Every logit is bitwise what
// each computes alone: the interleaving changes when work runs, never what
// it computes. The prompt waits after its first chunk until a decode step
// has run, so the lanes interleave by construction.
TEST_F(ModelTest, LanesSharingOnePoolComputeBitwiseWhatEachComputesAlone) {
  const std::vector<int32_t> prompt = Prompt(300, 7);
  const std::vector<int32_t> context = Prompt(40, 8);
  std::vector<int32_t> prompt_table, decode_table;
  for (int b = 0; b < 19; ++b) prompt_table.push_back(b);
  for (int b = 19; b < 23; ++b) decode_table.push_back(b);
  constexpr int kChunk = 64;
  constexpr int kDecodeSteps = 12;

  // The decode sequence: its context, then kDecodeSteps tokens one by one;
  // the logits of each step.
  auto decode_steps = [&](model::LlamaModel& m, kernels::Backend& backend,
                          const std::function<void(int)>& after_step) {
    std::vector<std::vector<float>> out;
    Logits(m, context, 40, decode_table);
    for (int i = 0; i < kDecodeSteps; ++i) {
      const int32_t token = 300 + i;
      model::SequenceInput in{{&token, 1}, 40 + i, decode_table, 1};
      std::vector<float> logits;
      backend.BeginStep();
      EXPECT_TRUE(m.Forward({&in, 1}, &logits).ok());
      backend.EndStep();
      out.push_back(std::move(logits));
      after_step(i);
    }
    return out;
  };

  // Alone, each on a pool of its own.
  Loaded alone = Load(2);
  const std::vector<float> prompt_alone = Logits(*alone.model, prompt, kChunk, prompt_table);
  const auto decode_alone = decode_steps(*alone.model, *alone.backend, [](int) {});

  // Together on one pool of 3 threads.
  auto pool = std::make_shared<kernels::cpu::ComputePool>(3);
  auto prefill_backend =
      std::make_unique<kernels::cpu::CpuBackend>(pool, kernels::LanePriority::kThroughput);
  auto decode_backend =
      std::make_unique<kernels::cpu::CpuBackend>(pool, kernels::LanePriority::kLatency);
  auto prefill_model = model::LlamaModel::Create(file_, prefill_backend.get(), kBlocks, kBlockSize);
  ASSERT_TRUE(prefill_model.ok()) << prefill_model.status();
  auto decode_model = model::LlamaModel::CreateSharingKv(**prefill_model, decode_backend.get());
  ASSERT_TRUE(decode_model.ok()) << decode_model.status();

  std::atomic<int> decode_done{0};
  std::vector<std::vector<float>> decode_shared;
  std::thread decoder([&] {
    decode_shared =
        decode_steps(**decode_model, *decode_backend, [&](int i) { decode_done.store(i + 1); });
  });
  std::vector<float> prompt_shared;
  prefill_backend->BeginStep();
  for (size_t pos = 0; pos < prompt.size(); pos += kChunk) {
    const size_t n = std::min<size_t>(kChunk, prompt.size() - pos);
    model::SequenceInput in{{prompt.data() + pos, n},
                            static_cast<int32_t>(pos),
                            prompt_table,
                            pos + n == prompt.size() ? 1 : 0};
    ASSERT_TRUE((*prefill_model)->Forward({&in, 1}, &prompt_shared).ok());
    if (pos == 0) {
      const absl::Time deadline = absl::Now() + absl::Seconds(60);
      while (decode_done.load() == 0 && absl::Now() < deadline) std::this_thread::yield();
      ASSERT_GT(decode_done.load(), 0) << "no decode step within 60 s";
    }
  }
  const absl::Duration yielded = prefill_backend->EndStep();
  decoder.join();

  EXPECT_GT(yielded, absl::ZeroDuration()) << "the lanes did not interleave";
  ASSERT_EQ(prompt_shared.size(), prompt_alone.size());
  EXPECT_EQ(
      std::memcmp(prompt_shared.data(), prompt_alone.data(), prompt_alone.size() * sizeof(float)),
      0);
  ASSERT_EQ(decode_shared.size(), decode_alone.size());
  for (size_t i = 0; i < decode_alone.size(); ++i) {
    ASSERT_EQ(decode_shared[i].size(), decode_alone[i].size());
    EXPECT_EQ(std::memcmp(decode_shared[i].data(), decode_alone[i].data(),
                          decode_alone[i].size() * sizeof(float)),
              0)
        << "decode step " << i;
  }
}

}  // namespace
}  // namespace tandem
