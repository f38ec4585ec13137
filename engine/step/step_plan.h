// The contract between the scheduler and the workers: plain data.
//
// The scheduler decides, per step, which tokens of which sequences run, where
// their KV goes and whether to sample; a worker executes the plan and returns
// what it sampled. Neither side shares any other state, so scheduler tests
// run against a fake worker with no model loaded.
#ifndef TANDEM_ENGINE_STEP_STEP_PLAN_H_
#define TANDEM_ENGINE_STEP_STEP_PLAN_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tandem::grammar {
class GrammarState;
}  // namespace tandem::grammar

namespace tandem::step {

using TokenId = int32_t;
using BlockId = int32_t;

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;        // 1: no limit
  uint64_t seed = 0;         // with draw_index, fixes every random draw
};

// Who drafts tokens for speculative decoding (engine/speculative).
enum class Proposer : uint8_t {
  kNone = 0,
  kNgram = 1,       // the continuation of the latest earlier match of the sequence's last tokens
  kDraftModel = 2,  // the worker's draft model
  kSuffix = 3,      // the continuation of the longest earlier match, following the copy it is in
};

// Where a draft came from.
enum class DraftSource : uint8_t {
  kRequest = 0,  // the sequence's own tokens (n-gram, suffix)
  kGlobal = 1,   // other requests' text of the same cache salt (suffix)
  kModel = 2,    // a draft model
};

// One sequence's work in a step: run `tokens` at positions first_position..,
// with KV for all earlier positions already in `block_table`'s blocks, which
// also have room for these tokens.
struct SequenceStep {
  uint64_t sequence_id = 0;
  std::vector<TokenId> tokens;
  int32_t first_position = 0;
  std::vector<BlockId> block_table;
  // Sample the token that follows the last one, as the request's
  // `draw_index`-th generated token (0-based).
  bool sample = false;
  SamplingParams sampling;
  uint64_t draw_index = 0;
  // With sample: also return the sampled token's log-probability and this
  // many most likely alternatives (0: no log-probabilities).
  int32_t logprobs = 0;

  // Speculative decoding (with sample): `proposer` drafts up to `draft_limit`
  // tokens to follow `tokens`, and the step verifies them in the same forward
  // pass. The block table has room for them. Accepted drafts come back as
  // sampled tokens; the KV written for rejected ones is garbage that no later
  // step reads (every position is rewritten before it counts as computed).
  Proposer proposer = Proposer::kNone;
  int32_t draft_limit = 0;
  // The sequence's tokens before `tokens` (prompt and generated), for
  // proposers that search them. Set only for Proposer::kNgram and kSuffix.
  std::vector<TokenId> preceding_tokens;
  // The request's cache salt (Proposer::kSuffix): drafts may copy earlier
  // requests' text only from requests of the same salt.
  std::string cache_salt;

  // Structured output (with sample): the request's grammar. Each of the
  // step's rows is masked to the tokens it allows there before sampling
  // (row j after the first j drafted tokens). The worker leaves it as it
  // found it; the scheduler advances it over the tokens it commits. Not
  // owned: the scheduler keeps it alive while the step runs.
  grammar::GrammarState* grammar = nullptr;
};

// Duplicate KV block `from` into `to` (every layer) before running the step:
// copy-on-write of a partly filled block shared by forked sequences.
struct BlockCopy {
  BlockId from = 0;
  BlockId to = 0;
};

struct StepPlan {
  std::vector<BlockCopy> block_copies;  // applied first, in order
  std::vector<SequenceStep> sequences;

  int64_t TokenCount() const {
    int64_t n = 0;
    for (const SequenceStep& s : sequences) n += static_cast<int64_t>(s.tokens.size());
    return n;
  }
};

// The model's log-probabilities (log-softmax of the logits, before
// temperature and truncation) at a sampled position.
struct TokenLogprobs {
  TokenId token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<TokenId, float>> top;  // most likely first
};

struct SequenceResult {
  uint64_t sequence_id = 0;
  // When the step asked to sample: the accepted drafted tokens, then the
  // token sampled after them (so always at least one). Empty otherwise.
  std::vector<TokenId> sampled;
  // When the step asked for them: one entry per sampled token.
  std::vector<TokenLogprobs> logprobs;
  // Speculation: tokens drafted and verified, and how many of them were
  // accepted. The step computed the KV of `tokens` and of the accepted
  // drafts, nothing more.
  Proposer proposer = Proposer::kNone;
  DraftSource draft_source = DraftSource::kRequest;
  // A copying proposer's (suffix): the tokens its copy had agreed with the
  // sequence when it drafted (match plus tokens followed since); 0 when the
  // proposer does not copy. The scheduler prices drafts by it.
  int32_t draft_match = 0;
  // Its copy goes on: every drafted token was accepted, and the sampled
  // token after them is the copy's next one too.
  bool draft_copy_goes_on = false;
  int32_t drafted = 0;
  int32_t accepted = 0;
};

// Results in plan order. A failed step (status not OK) computed nothing the
// scheduler may rely on.
struct StepResult {
  absl::Status status;
  std::vector<SequenceResult> sequences;
  // On compute shared by two lanes (kernels::Backend::BeginStep): how long
  // the step waited for the compute before it started (decode), and how long
  // it yielded the compute to the other lane while it ran (prefill).
  absl::Duration start_delay;
  absl::Duration yielded;
};

// Runs plans. Implementations: the model workers (engine/prefill,
// engine/decode) and fake workers in scheduler tests.
class Worker {
 public:
  virtual ~Worker() = default;
  // Called once on the thread that will call Execute, before the first step.
  virtual void OnThreadStart() {}
  virtual StepResult Execute(const StepPlan& plan) = 0;
};

}  // namespace tandem::step

#endif  // TANDEM_ENGINE_STEP_STEP_PLAN_H_
