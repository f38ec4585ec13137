// KV that moves between storages in SchedulerCore. Remote decode: a prefill
// daemon's core hands a request to
// a decode daemon's core (two cores, two fake workers whose "KV" is moved by
// copying block slots, as the KV transport would), with leases, failures and
// aborts. Separate storages in one daemon: the decode lane's own pool, page
// moves, failed moves, a full pool. The fake worker samples from every token
// read back through the
// block table, so a wrong block id, a page moved wrongly or a lost token
// changes the output.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

#include "scheduler/scheduler_core.h"
#include "tests/unit/fake_worker.h"

namespace tandem::scheduler {
namespace {

constexpr int32_t kBlockSize = 4;
constexpr int32_t kBlocks = 64;
constexpr int32_t kThreshold = 3;

using testing::FakeWorker;
using ::testing::HasSubstr;
using testing::MakeRequest;
using testing::Record;

SchedulerOptions Options(bool remote_decode, absl::Time* now) {
  SchedulerOptions o;
  o.max_batched_tokens = 16;
  o.block_size = kBlockSize;
  o.kv_blocks = kBlocks;
  o.context_length = 256;
  o.remote_decode = remote_decode;
  if (remote_decode) o.disaggregation.output_threshold = kThreshold;
  o.kv_lease = absl::Seconds(30);
  o.clock = [now] { return *now; };
  return o;
}

// Steps `lane` of `core` until `done` holds or nothing is left to run.
template <typename Done>
void RunUntil(SchedulerCore& core, FakeWorker& worker, Lane lane, Done done) {
  for (int steps = 0; steps < 1000 && !done(); ++steps) {
    step::StepPlan plan = core.Schedule(lane);
    if (plan.sequences.empty()) break;
    core.Update(lane, plan, worker.Execute(plan));
  }
}

// The tokens of a request alone on one core, never handed off.
std::vector<TokenId> Alone(int32_t prompt, int32_t max_tokens) {
  absl::Time now = absl::UnixEpoch();
  SchedulerCore core(Options(false, &now));
  FakeWorker worker(kBlocks, kBlockSize);
  auto sink = std::make_shared<Record>();
  core.Add(1, MakeRequest(prompt, max_tokens, sink));
  RunUntil(core, worker, Lane::kPrefill, [&] { return sink->finishes > 0; });
  return sink->tokens;
}

// A prefill daemon's core and worker with one request handed off.
struct PrefillSide {
  absl::Time now = absl::UnixEpoch();
  SchedulerCore core{Options(true, &now)};
  FakeWorker worker{kBlocks, kBlockSize};
  std::shared_ptr<Record> sink = std::make_shared<Record>();
  HandoffOffer offer;

  explicit PrefillSide(int32_t prompt = 10, int32_t max_tokens = 12) {
    core.Add(7, MakeRequest(prompt, max_tokens, sink));
    std::vector<HandoffOffer> offers;
    RunUntil(core, worker, Lane::kPrefill, [&] {
      offers = core.TakeOffers();
      return !offers.empty();
    });
    EXPECT_EQ(offers.size(), 1u);
    if (!offers.empty()) offer = offers[0];
  }
};

// What a decode daemon is asked to import for `offer`, its tokens to `sink`.
ImportedRequest ImportOf(const HandoffOffer& offer, std::shared_ptr<Record> sink) {
  ImportedRequest imported;
  imported.request = offer.request;
  imported.request.sink = std::move(sink);
  imported.tokens = offer.tokens;
  imported.generated = offer.generated;
  return imported;
}

// A decode daemon's core and worker that imports `offer` and moves its pages.
struct DecodeSide {
  absl::Time now = absl::UnixEpoch();
  SchedulerCore core{Options(false, &now)};
  FakeWorker worker{kBlocks, kBlockSize};
  std::shared_ptr<Record> sink = std::make_shared<Record>();
  std::vector<int32_t> blocks;

  void Import(const HandoffOffer& offer, const FakeWorker& from) {
    absl::StatusOr<std::vector<int32_t>> reserved = core.Import(99, ImportOf(offer, sink));
    ASSERT_TRUE(reserved.ok()) << reserved.status();
    blocks = *reserved;
    worker.CopyBlocksFrom(from, offer.block_table, blocks);
  }
};

TEST(SchedulerRemoteTest, AHandedOffRequestDecodesOnAnotherCoreWithTheSameTokens) {
  const std::vector<TokenId> expected = Alone(10, 12);
  PrefillSide prefill;
  const HandoffOffer& offer = prefill.offer;
  // Handed off when its output reached the threshold: the prompt and three
  // tokens, all but the last with KV in the offered blocks.
  EXPECT_EQ(offer.sequence_id, 7u);
  EXPECT_EQ(offer.generated, kThreshold);
  ASSERT_EQ(offer.tokens.size(), 13u);
  EXPECT_EQ(offer.block_table.size(), 3u);  // 12 tokens of KV in 4-token blocks
  EXPECT_EQ(std::vector<TokenId>(offer.tokens.begin() + 10, offer.tokens.end()),
            std::vector<TokenId>(expected.begin(), expected.begin() + kThreshold));
  EXPECT_EQ(prefill.sink->tokens.size(), static_cast<size_t>(kThreshold));
  // The lease holds the blocks; nothing of it runs here meanwhile.
  EXPECT_EQ(prefill.core.free_blocks(), kBlocks - 3);
  EXPECT_EQ(prefill.core.remote(), 1);
  EXPECT_TRUE(prefill.core.Schedule(Lane::kPrefill).sequences.empty());

  DecodeSide decode;
  decode.Import(offer, prefill.worker);
  EXPECT_EQ(decode.blocks.size(), 3u);  // the pages that travel
  EXPECT_EQ(decode.core.free_blocks(), kBlocks - 4) << "and room for the next token";
  // Untouchable while its pages arrive.
  EXPECT_TRUE(decode.core.Schedule(Lane::kPrefill).sequences.empty());
  ASSERT_TRUE(prefill.core.CommitLease(7));
  EXPECT_EQ(prefill.core.free_blocks(), kBlocks);  // released once read
  EXPECT_FALSE(prefill.core.CommitLease(7));       // and only once
  decode.core.CompleteImport(99, absl::OkStatus());
  RunUntil(decode.core, decode.worker, Lane::kPrefill, [&] { return decode.sink->finishes > 0; });
  ASSERT_EQ(decode.sink->finishes, 1);
  EXPECT_EQ(decode.sink->finish->reason, FinishReason::kLength);
  EXPECT_EQ(decode.sink->finish->path, Path::kRemote);
  EXPECT_EQ(decode.core.free_blocks(), kBlocks);

  // Its tokens, relayed to the entering daemon, complete the answer.
  prefill.core.OnRemoteTokens(7, decode.sink->tokens, {});
  prefill.core.FinishRemote(7, FinishReason::kLength, 0, 0);
  EXPECT_EQ(prefill.sink->tokens, expected);
  ASSERT_EQ(prefill.sink->finishes, 1);
  EXPECT_EQ(prefill.sink->finish->path, Path::kRemote);
  EXPECT_EQ(prefill.sink->finish->usage.completion_tokens, 12);
  EXPECT_TRUE(prefill.core.TakeRemoteAborts().empty());  // it ended there
  EXPECT_EQ(prefill.core.remote(), 0);
}

TEST(SchedulerRemoteTest, AnExpiredLeaseIsNeverCommittedAndTheRequestContinuesHere) {
  const std::vector<TokenId> expected = Alone(10, 12);
  for (bool expire_first : {true, false}) {
    PrefillSide prefill;
    prefill.now += absl::Seconds(31);
    if (expire_first) {
      // Noticed at once: the request goes on here from its own blocks and
      // the peer is told to stop.
      prefill.core.ExpireDeadlines(prefill.now);
      EXPECT_EQ(prefill.core.remote(), 0);
      EXPECT_EQ(prefill.core.running(Lane::kPrefill), 1);
      EXPECT_EQ(prefill.core.free_blocks(), kBlocks - 3);
      EXPECT_EQ(prefill.core.TakeRemoteAborts(), std::vector<uint64_t>{7});
    }
    // The decode daemon read them too late: refused, whether or not the
    // expiry was noticed before.
    EXPECT_FALSE(prefill.core.CommitLease(7));
    EXPECT_EQ(prefill.core.lease_expirations(), 1);
    if (!expire_first) {
      EXPECT_EQ(prefill.core.free_blocks(), kBlocks);
    }
    prefill.core.ResumeLocally(7);  // the decode daemon gives up (a no-op if it went on)
    RunUntil(prefill.core, prefill.worker, Lane::kPrefill,
             [&] { return prefill.sink->finishes > 0; });
    EXPECT_EQ(prefill.sink->tokens, expected);
    ASSERT_EQ(prefill.sink->finishes, 1);
    EXPECT_EQ(prefill.sink->finish->path, Path::kColocated);
    EXPECT_TRUE(prefill.core.TakeOffers().empty()) << "never offered again";
    EXPECT_EQ(prefill.core.free_blocks(), kBlocks);
  }
}

TEST(SchedulerRemoteTest, APeerThatFailsBeforeTheCommitLeavesTheBlocksToGoOnFrom) {
  const std::vector<TokenId> expected = Alone(10, 12);
  PrefillSide prefill;
  prefill.core.ResumeLocally(7);
  // Its KV is still in its blocks: the next step decodes one token, no recompute.
  step::StepPlan plan = prefill.core.Schedule(Lane::kPrefill);
  ASSERT_EQ(plan.sequences.size(), 1u);
  EXPECT_EQ(plan.sequences[0].tokens.size(), 1u);
  EXPECT_EQ(plan.sequences[0].first_position, 12);
  prefill.core.Update(Lane::kPrefill, plan, prefill.worker.Execute(plan));
  RunUntil(prefill.core, prefill.worker, Lane::kPrefill,
           [&] { return prefill.sink->finishes > 0; });
  EXPECT_EQ(prefill.sink->tokens, expected);
  EXPECT_EQ(prefill.core.free_blocks(), kBlocks);
}

TEST(SchedulerRemoteTest, APeerThatDiesMidStreamLosesNoToken) {
  const std::vector<TokenId> expected = Alone(10, 12);
  PrefillSide prefill;
  ASSERT_TRUE(prefill.core.CommitLease(7));
  // The decode daemon sent four tokens, then vanished.
  prefill.core.OnRemoteTokens(
      7, std::vector<TokenId>(expected.begin() + kThreshold, expected.begin() + kThreshold + 4),
      {});
  prefill.core.ResumeLocally(7);
  // Recomputed from its tokens (its pages went back to the pool).
  RunUntil(prefill.core, prefill.worker, Lane::kPrefill,
           [&] { return prefill.sink->finishes > 0; });
  EXPECT_EQ(prefill.sink->tokens, expected);
  ASSERT_EQ(prefill.sink->finishes, 1);
  EXPECT_EQ(prefill.sink->finish->reason, FinishReason::kLength);
  EXPECT_EQ(prefill.core.free_blocks(), kBlocks);
}

TEST(SchedulerRemoteTest, APeerThatFailsAfterTheLastTokenEndsTheRequestInsteadOfResumingIt) {
  const std::vector<TokenId> expected = Alone(10, 12);
  PrefillSide prefill;
  ASSERT_TRUE(prefill.core.CommitLease(7));
  // Every remaining token arrived, then the call broke before its end.
  prefill.core.OnRemoteTokens(
      7, std::vector<TokenId>(expected.begin() + kThreshold, expected.end()), {});
  prefill.core.ResumeLocally(7);
  EXPECT_EQ(prefill.sink->tokens, expected) << "no token past max_tokens";
  ASSERT_EQ(prefill.sink->finishes, 1);
  EXPECT_EQ(prefill.sink->finish->reason, FinishReason::kLength);
  EXPECT_FALSE(prefill.core.HasWork());
  EXPECT_TRUE(prefill.core.TakeRemoteAborts().empty());
}

TEST(SchedulerRemoteTest, ARemoteRequestThatEndsHereFreesItsLeaseAndAbortsThePeer) {
  {  // cancelled during the transfer
    PrefillSide prefill;
    prefill.core.Cancel(7, FinishReason::kCancelled, absl::CancelledError("client"));
    EXPECT_EQ(prefill.core.free_blocks(), kBlocks);
    EXPECT_EQ(prefill.core.TakeRemoteAborts(), std::vector<uint64_t>{7});
    ASSERT_EQ(prefill.sink->finishes, 1);
    EXPECT_EQ(prefill.sink->finish->stage, Stage::kHandoff);
    EXPECT_FALSE(prefill.core.CommitLease(7));
    prefill.core.OnRemoteTokens(7, std::vector<TokenId>{5}, {});  // late: ignored
    prefill.core.ResumeLocally(7);                                // late: ignored
    EXPECT_EQ(prefill.sink->tokens.size(), static_cast<size_t>(kThreshold));
    EXPECT_FALSE(prefill.core.HasWork());
  }
  {  // its deadline passes while it decodes there
    PrefillSide prefill;
    ASSERT_TRUE(prefill.core.CommitLease(7));
    prefill.core.Cancel(7, FinishReason::kCancelled, absl::DeadlineExceededError("deadline"));
    EXPECT_EQ(prefill.core.TakeRemoteAborts(), std::vector<uint64_t>{7});
    EXPECT_EQ(prefill.sink->finish->stage, Stage::kDecode);
    EXPECT_EQ(prefill.sink->finish->path, Path::kRemote);
  }
  {  // a stop string matches a token the peer sent
    PrefillSide prefill;
    ASSERT_TRUE(prefill.core.CommitLease(7));
    prefill.sink->stop_after = kThreshold + 2;
    prefill.core.OnRemoteTokens(7, std::vector<TokenId>{11, 12, 13}, {});
    EXPECT_EQ(prefill.sink->tokens.size(), static_cast<size_t>(kThreshold + 2));
    EXPECT_EQ(prefill.sink->finish->reason, FinishReason::kStop);
    EXPECT_EQ(prefill.core.TakeRemoteAborts(), std::vector<uint64_t>{7});
  }
}

// The lease-end hook (what revokes the peer's read grant) runs exactly once
// per offer, however the lease ends, and while the offer's blocks are still
// the request's: before they go back to the pool.
TEST(SchedulerRemoteTest, TheLeaseEndHookRunsOnceBeforeTheBlocksAreReleased) {
  enum class End { kCommit, kExpire, kPeerFails, kCancel };
  for (End end : {End::kCommit, End::kExpire, End::kPeerFails, End::kCancel}) {
    PrefillSide prefill;
    EXPECT_TRUE(prefill.core.LeaseHeld(7));
    std::vector<uint64_t> ended;
    std::vector<int32_t> free_when_ended;
    prefill.core.SetLeaseEndHook([&](uint64_t id) {
      ended.push_back(id);
      free_when_ended.push_back(prefill.core.free_blocks());
    });
    switch (end) {
      case End::kCommit:
        ASSERT_TRUE(prefill.core.CommitLease(7));
        break;
      case End::kExpire:
        prefill.now += absl::Seconds(31);
        prefill.core.ExpireDeadlines(prefill.now);
        break;
      case End::kPeerFails:
        prefill.core.ResumeLocally(7);
        break;
      case End::kCancel:
        prefill.core.Cancel(7, FinishReason::kCancelled, absl::CancelledError("client"));
        break;
    }
    EXPECT_EQ(ended, std::vector<uint64_t>{7}) << static_cast<int>(end);
    // What the scheduler checks before it offers: a stale offer never goes.
    EXPECT_FALSE(prefill.core.LeaseHeld(7)) << static_cast<int>(end);
    EXPECT_EQ(free_when_ended, std::vector<int32_t>{kBlocks - 3}) << static_cast<int>(end);
    // Nothing that follows ends it again.
    prefill.core.CommitLease(7);
    prefill.core.ResumeLocally(7);
    prefill.core.Cancel(7, FinishReason::kCancelled, absl::CancelledError("client"));
    RunUntil(prefill.core, prefill.worker, Lane::kPrefill, [&] { return !prefill.core.HasWork(); });
    EXPECT_EQ(ended.size(), 1u) << static_cast<int>(end);
  }
}

TEST(SchedulerRemoteTest, AnImportIsUntouchableUntilItsTransferEndsThenEndsOnce) {
  PrefillSide prefill;
  {  // cancelled while its pages arrive: freed when the transfer has ended
    DecodeSide decode;
    decode.Import(prefill.offer, prefill.worker);
    decode.core.Cancel(99, FinishReason::kCancelled, absl::CancelledError("peer gone"));
    EXPECT_EQ(decode.core.free_blocks(), kBlocks - 4) << "freed under a running transfer";
    EXPECT_EQ(decode.sink->finishes, 0);
    decode.core.CompleteImport(99, absl::OkStatus());
    EXPECT_EQ(decode.core.free_blocks(), kBlocks);
    ASSERT_EQ(decode.sink->finishes, 1);
    EXPECT_EQ(decode.sink->finish->reason, FinishReason::kCancelled);
    decode.core.CompleteImport(99, absl::OkStatus());  // again: ignored
    EXPECT_EQ(decode.sink->finishes, 1);
  }
  {  // the transfer failed
    DecodeSide decode;
    decode.Import(prefill.offer, prefill.worker);
    decode.core.CompleteImport(99, absl::UnavailableError("transfer failed"));
    EXPECT_EQ(decode.core.free_blocks(), kBlocks);
    ASSERT_EQ(decode.sink->finishes, 1);
    EXPECT_EQ(decode.sink->finish->reason, FinishReason::kError);
    EXPECT_TRUE(absl::IsUnavailable(decode.sink->finish->error));
  }
  {  // the daemon stops while the pages arrive: ended at once, blocks back
    DecodeSide decode;
    decode.Import(prefill.offer, prefill.worker);
    decode.core.AbandonTransfers(absl::UnavailableError("shutting down"));
    EXPECT_EQ(decode.core.free_blocks(), kBlocks);
    ASSERT_EQ(decode.sink->finishes, 1);
    EXPECT_EQ(decode.sink->finish->reason, FinishReason::kCancelled);
    EXPECT_TRUE(absl::IsUnavailable(decode.sink->finish->error));
    decode.core.CompleteImport(99, absl::OkStatus());  // the transfer ends later: ignored
    EXPECT_EQ(decode.sink->finishes, 1);
  }
  {  // no room: refused, nothing held
    absl::Time now = absl::UnixEpoch();
    SchedulerOptions options = Options(false, &now);
    options.kv_blocks = 2;
    SchedulerCore small(options);
    absl::StatusOr<std::vector<int32_t>> reserved =
        small.Import(1, ImportOf(prefill.offer, std::make_shared<Record>()));
    EXPECT_TRUE(absl::IsResourceExhausted(reserved.status())) << reserved.status();
    EXPECT_EQ(small.free_blocks(), 2);
    EXPECT_FALSE(small.HasWork());
  }
  {  // a full running batch: refused, nothing held
    absl::Time now = absl::UnixEpoch();
    SchedulerOptions options = Options(false, &now);
    options.max_running = 1;
    SchedulerCore full(options);
    full.Add(5, MakeRequest(4, 8, std::make_shared<Record>()));
    FakeWorker worker{kBlocks, kBlockSize};
    const step::StepPlan plan = full.Schedule(Lane::kPrefill);
    ASSERT_EQ(plan.sequences.size(), 1u);
    full.Update(Lane::kPrefill, plan, worker.Execute(plan));
    const int32_t free = full.free_blocks();
    absl::StatusOr<std::vector<int32_t>> reserved =
        full.Import(1, ImportOf(prefill.offer, std::make_shared<Record>()));
    EXPECT_TRUE(absl::IsResourceExhausted(reserved.status())) << reserved.status();
    EXPECT_THAT(std::string(reserved.status().message()), HasSubstr("--max_running=1"));
    EXPECT_EQ(full.free_blocks(), free);
  }
  {  // inconsistent counts are refused
    DecodeSide decode;
    ImportedRequest imported = ImportOf(prefill.offer, decode.sink);
    imported.generated += 1;
    EXPECT_TRUE(absl::IsInvalidArgument(decode.core.Import(1, std::move(imported)).status()));
  }
}

// --- one daemon, two workers with KV storages of their own -----------------

// A core whose decode lane keeps its KV in a pool of its own, with a fake
// worker per lane (separate "storages"); Run() steps both lanes and performs
// the page moves the core asks for as the mover would, or fails them.
struct SeparateStorages {
  absl::Time now = absl::UnixEpoch();
  SchedulerCore core;
  FakeWorker prefill{kBlocks, kBlockSize};
  FakeWorker decode;
  std::vector<BlockMove> moves;

  explicit SeparateStorages(int32_t decode_blocks)
      : core([&] {
          SchedulerOptions o = Options(false, &now);
          o.decode_lane = true;
          o.disaggregation.output_threshold = kThreshold;
          o.decode_kv_blocks = decode_blocks;
          return o;
        }()),
        decode(decode_blocks, kBlockSize) {}

  // Steps until `sink` finishes; moves complete with `move_status`.
  void Run(Record& sink, const absl::Status& move_status) {
    for (int steps = 0; steps < 1000 && sink.finishes == 0; ++steps) {
      for (Lane lane : {Lane::kPrefill, Lane::kDecode}) {
        step::StepPlan plan = core.Schedule(lane);
        if (plan.sequences.empty()) continue;
        FakeWorker& worker = lane == Lane::kPrefill ? prefill : decode;
        core.Update(lane, plan, worker.Execute(plan));
      }
      for (BlockMove& m : core.TakeMoves()) {
        if (move_status.ok()) decode.CopyBlocksFrom(prefill, m.from, m.to);
        core.CompleteMove(m.sequence_id, move_status);
        moves.push_back(std::move(m));
      }
    }
  }
};

TEST(SchedulerKvMoveTest, AHandoffMovesThePagesToTheDecodeLanesOwnPoolAndChangesNoToken) {
  const std::vector<TokenId> expected = Alone(10, 12);
  SeparateStorages daemon(32);
  auto sink = std::make_shared<Record>();
  daemon.core.Add(7, MakeRequest(10, 12, sink));
  daemon.Run(*sink, absl::OkStatus());
  EXPECT_EQ(sink->tokens, expected);
  ASSERT_EQ(daemon.moves.size(), 1u);
  // The 12 tokens with KV at the handoff: 3 blocks, each to a block of the
  // decode lane's pool.
  EXPECT_EQ(daemon.moves[0].from.size(), 3u);
  EXPECT_EQ(daemon.moves[0].to.size(), 3u);
  ASSERT_EQ(sink->finishes, 1);
  EXPECT_EQ(sink->finish->path, Path::kDisaggregated);
  EXPECT_EQ(daemon.core.free_blocks(), kBlocks + 32);
  EXPECT_EQ(daemon.core.total_blocks(), kBlocks + 32);
}

TEST(SchedulerKvMoveTest, AFailedMoveLeavesTheRequestOnThePrefillLaneFromItsPages) {
  const std::vector<TokenId> expected = Alone(10, 12);
  SeparateStorages daemon(32);
  auto sink = std::make_shared<Record>();
  daemon.core.Add(7, MakeRequest(10, 12, sink));
  daemon.Run(*sink, absl::UnavailableError("the transport broke"));
  EXPECT_EQ(sink->tokens, expected);
  EXPECT_EQ(daemon.moves.size(), 1u) << "tried once, not again";
  EXPECT_EQ(sink->finish->path, Path::kColocated);
  EXPECT_EQ(daemon.core.free_blocks(), kBlocks + 32);
}

TEST(SchedulerKvMoveTest, AFullDecodePoolKeepsTheRequestColocated) {
  const std::vector<TokenId> expected = Alone(10, 12);
  SeparateStorages daemon(2);  // fewer blocks than the request needs
  auto sink = std::make_shared<Record>();
  daemon.core.Add(7, MakeRequest(10, 12, sink));
  daemon.Run(*sink, absl::OkStatus());
  EXPECT_EQ(sink->tokens, expected);
  EXPECT_TRUE(daemon.moves.empty());
  EXPECT_EQ(sink->finish->path, Path::kColocated);
  EXPECT_EQ(daemon.core.free_blocks(), kBlocks + 2);
}

TEST(SchedulerKvMoveTest, ACancellationDuringAMoveFreesBothPoolsWhenTheMoveEnds) {
  SeparateStorages daemon(32);
  auto sink = std::make_shared<Record>();
  daemon.core.Add(7, MakeRequest(10, 12, sink));
  std::vector<BlockMove> moves;
  for (int steps = 0; steps < 100 && moves.empty(); ++steps) {
    step::StepPlan plan = daemon.core.Schedule(Lane::kPrefill);
    daemon.core.Update(Lane::kPrefill, plan, daemon.prefill.Execute(plan));
    moves = daemon.core.TakeMoves();
  }
  ASSERT_EQ(moves.size(), 1u);
  // Held in both pools while the pages move; untouchable.
  EXPECT_EQ(daemon.core.free_blocks(), kBlocks + 32 - 3 - 4);
  EXPECT_TRUE(daemon.core.Schedule(Lane::kDecode).sequences.empty());
  daemon.core.Cancel(7, FinishReason::kCancelled, absl::CancelledError("client"));
  EXPECT_EQ(sink->finishes, 0);
  daemon.core.CompleteMove(7, absl::OkStatus());
  ASSERT_EQ(sink->finishes, 1);
  EXPECT_EQ(sink->finish->reason, FinishReason::kCancelled);
  EXPECT_EQ(sink->finish->stage, Stage::kHandoff);
  EXPECT_EQ(daemon.core.free_blocks(), kBlocks + 32);
  EXPECT_FALSE(daemon.core.HasWork());
}

}  // namespace
}  // namespace tandem::scheduler
