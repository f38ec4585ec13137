// A fake worker for scheduler tests: it keeps a token "KV cache" in the
// scheduler's block ids, writing each step's tokens into the slots its block
// table names (after the step's block copies), and samples a token that
// hashes every earlier token read back through the table. So any mistake in
// block tables, positions, chunking, copy-on-write or recompute after
// preemption changes the generated tokens. And a sink that records them.
#ifndef TANDEM_TESTS_UNIT_FAKE_WORKER_H_
#define TANDEM_TESTS_UNIT_FAKE_WORKER_H_

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "engine/step/step_plan.h"
#include "scheduler/request.h"

namespace tandem::scheduler::testing {

class FakeWorker {
 public:
  FakeWorker(int32_t blocks, int32_t block_size)
      : block_size_(block_size), slots_(static_cast<size_t>(blocks * block_size), -1) {}

  step::StepResult Execute(const step::StepPlan& plan) {
    for (const step::BlockCopy& c : plan.block_copies) {
      for (int32_t i = 0; i < block_size_; ++i) {
        slots_[static_cast<size_t>(c.to * block_size_ + i)] =
            slots_[static_cast<size_t>(c.from * block_size_ + i)];
      }
    }
    step::StepResult result;
    for (const step::SequenceStep& s : plan.sequences) {
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        slots_[Slot(s, s.first_position + static_cast<int32_t>(i))] = s.tokens[i];
      }
      step::SequenceResult r;
      r.sequence_id = s.sequence_id;
      if (s.sample) {
        uint64_t h = 1469598103934665603ull ^ s.sampling.seed;
        const int32_t end = s.first_position + static_cast<int32_t>(s.tokens.size());
        for (int32_t pos = 0; pos < end; ++pos) {
          h = (h ^ static_cast<uint64_t>(slots_[Slot(s, pos)] + 7)) * 1099511628211ull;
        }
        r.sampled = static_cast<TokenId>(10 + h % 1000);
      }
      result.sequences.push_back(r);
    }
    return result;
  }

 private:
  size_t Slot(const step::SequenceStep& s, int32_t pos) const {
    return static_cast<size_t>(
        s.block_table.at(static_cast<size_t>(pos / block_size_)) * block_size_ + pos % block_size_);
  }
  int32_t block_size_;
  std::vector<TokenId> slots_;
};

struct Record : RequestSink {
  std::vector<TokenId> tokens;
  std::optional<FinishInfo> finish;
  int finishes = 0;
  int stop_after = -1;  // ask to stop after this many tokens (as a stop string would)

  bool OnToken(TokenId token, bool, const step::TokenLogprobs*) override {
    EXPECT_EQ(finishes, 0) << "a token after the end";
    tokens.push_back(token);
    return stop_after >= 0 && static_cast<int>(tokens.size()) >= stop_after;
  }
  void OnFinish(const FinishInfo& info) override {
    EXPECT_EQ(finishes, 0) << "OnFinish called twice";
    ++finishes;
    finish = info;
  }
};

}  // namespace tandem::scheduler::testing

#endif  // TANDEM_TESTS_UNIT_FAKE_WORKER_H_
