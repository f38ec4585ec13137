// A fake worker for scheduler tests: it keeps a token "KV cache" in the
// scheduler's block ids, writing each step's tokens into the slots its block
// table names (after the step's block copies), and samples a token that
// hashes every earlier token read back through the table. So any mistake in
// block tables, positions, chunking, copy-on-write or recompute after
// preemption changes the generated tokens. And a sink that records them.
//
// Speculation: for a step with a draft limit L it drafts a few correct
// tokens (how many depends on the position) and then a wrong one, writes
// them all into the KV slots as a real worker would, and verifies them
// greedily. Rejected tokens stay in the slots, so a scheduler that let a
// later step read them would change the output.
#ifndef TANDEM_TESTS_UNIT_FAKE_WORKER_H_
#define TANDEM_TESTS_UNIT_FAKE_WORKER_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <span>
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
      if (!s.sample) {
        result.sequences.push_back(r);
        continue;
      }
      const int32_t last = s.first_position + static_cast<int32_t>(s.tokens.size()) - 1;
      std::vector<TokenId> draft;
      if (s.draft_limit > 0) {
        // Correct tokens (found by running ahead), then a wrong one.
        const int32_t correct = static_cast<int32_t>(Next(s, last) % (s.draft_limit + 1));
        for (int32_t j = 0; j < s.draft_limit; ++j) {
          const TokenId truth = static_cast<TokenId>(10 + Next(s, last + j) % 1000);
          draft.push_back(j < correct ? truth : truth + 1);
          slots_[Slot(s, last + j + 1)] = draft.back();
          if (j >= correct) break;
        }
      }
      // Verification: write the drafts, then sample after each position.
      for (size_t j = 0; j < draft.size(); ++j) {
        slots_[Slot(s, last + 1 + static_cast<int32_t>(j))] = draft[j];
      }
      for (size_t j = 0; j <= draft.size(); ++j) {
        const TokenId y = static_cast<TokenId>(10 + Next(s, last + static_cast<int32_t>(j)) % 1000);
        r.sampled.push_back(y);
        if (j == draft.size() || y != draft[j]) break;
        ++r.accepted;
      }
      r.proposer = draft.empty() ? step::Proposer::kNone : s.proposer;
      r.drafted = static_cast<int32_t>(draft.size());
      result.sequences.push_back(r);
    }
    return result;
  }

  // Sliding-window attention: a sampled token hashes only the last `window`
  // positions, as a sliding-window layer reads them (0: every position).
  void SetWindow(int32_t window) { window_ = window; }
  // What giving back blocks' sliding-layer pages does: their tokens are lost.
  void Clobber(std::span<const int32_t> blocks) {
    for (int32_t b : blocks) {
      for (int32_t i = 0; i < block_size_; ++i)
        slots_[static_cast<size_t>(b * block_size_ + i)] = -2;
    }
  }

  // What a KV transfer between two daemons does: block src[i] of `from`'s
  // storage into block dst[i] of this one's.
  void CopyBlocksFrom(const FakeWorker& from, const std::vector<int32_t>& src,
                      const std::vector<int32_t>& dst) {
    for (size_t b = 0; b < src.size(); ++b) {
      for (int32_t i = 0; i < block_size_; ++i) {
        slots_[static_cast<size_t>(dst[b] * block_size_ + i)] =
            from.slots_[static_cast<size_t>(src[b] * block_size_ + i)];
      }
    }
  }

 private:
  // The hash of every token at positions 0..pos (the window's last ones
  // with SetWindow), read through the table.
  uint64_t Next(const step::SequenceStep& s, int32_t pos) const {
    uint64_t h = 1469598103934665603ull ^ s.sampling.seed;
    for (int32_t p = window_ > 0 ? std::max(0, pos + 1 - window_) : 0; p <= pos; ++p) {
      h = (h ^ static_cast<uint64_t>(slots_[Slot(s, p)] + 7)) * 1099511628211ull;
    }
    return h;
  }
  size_t Slot(const step::SequenceStep& s, int32_t pos) const {
    return static_cast<size_t>(
        s.block_table.at(static_cast<size_t>(pos / block_size_)) * block_size_ + pos % block_size_);
  }
  int32_t block_size_;
  int32_t window_ = 0;
  std::vector<TokenId> slots_;
};

// A request whose prompt is `prompt_tokens` ids derived from `seed` (ids
// 1000 + (i * stride + seed) % 97), with `max_tokens` and that seed.
inline Request MakeRequest(int32_t prompt_tokens, int32_t max_tokens,
                           std::shared_ptr<RequestSink> sink, uint64_t seed = 1,
                           int32_t stride = 3) {
  Request r;
  for (int32_t i = 0; i < prompt_tokens; ++i)
    r.prompt.push_back(1000 + (i * stride + static_cast<int32_t>(seed)) % 97);
  r.max_tokens = max_tokens;
  r.sampling.seed = seed;
  r.sink = std::move(sink);
  return r;
}

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
