// Several daemons on this machine over loopback: a prefill daemon
// (--role=prefill) hands requests to decode daemons (--role=decode) over the
// Peer service and the UCX KV transport. Greedy answers equal one unified
// daemon's; the KV bytes moved are exactly the handed-off pages; a decode
// daemon killed mid-stream, a transfer that fails half way and a lease that
// runs out all leave the request to finish on the entering daemon with the
// same tokens; a client's abort frees the pages on both daemons. And one
// daemon whose two workers keep their KV apart moves pages the same way.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <future>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "tandem/v1/peer.grpc.pb.h"
#include "tests/e2e/daemon.h"

namespace tandem::testing {
namespace {

// Small enough for three daemons on two cores.
const std::vector<std::string> kCommon = {"--threads=1", "--kv_cache_bytes=67108864",
                                          "--context_length=1024"};
constexpr int kThreshold = 8;
// SmolLM2-135M's KV block: 2 (K and V) x 30 layers x 16 tokens x 3 KV heads
// x 64 dimensions x 2 bytes.
constexpr double kBytesPerBlock = 2.0 * 30 * 16 * 3 * 64 * 2;

std::vector<std::string> With(std::vector<std::string> flags) {
  flags.insert(flags.end(), kCommon.begin(), kCommon.end());
  return flags;
}

// Greedy request `i`: a prompt of 30 + 11 i token ids, exactly `max_tokens`
// generated, no speculation (so the handoff happens at exactly the
// threshold and the pages it moves are known).
v1::GenerateRequest Request(int i, int max_tokens) {
  v1::GenerateRequest r;
  for (int t = 0; t < 30 + 11 * i; ++t) {
    r.add_token_ids(static_cast<uint32_t>(600 + (t * 7919 + i * 104729) % 40000));
  }
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(true);
  r.set_disable_speculation(true);
  r.mutable_sampling()->set_temperature(0.0f);
  return r;
}

// KV blocks a request's handoff moves: its prompt and the threshold's tokens
// but the last have KV.
int HandedOffBlocks(int i) { return (30 + 11 * i + kThreshold - 1 + 15) / 16; }

std::vector<Generation> RunConcurrently(Daemon& daemon, int count, int max_tokens) {
  std::vector<std::future<Generation>> futures;
  for (int i = 0; i < count; ++i) {
    futures.push_back(std::async(std::launch::async, [&daemon, i, max_tokens] {
      auto stub = daemon.Stub();
      return Generate(*stub, Request(i, max_tokens));
    }));
  }
  std::vector<Generation> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

// The answers of one unified daemon (the reference) to requests 0..count-1,
// sent at once; computed once per test program.
const std::vector<std::vector<uint32_t>>& Reference(int max_tokens, int count = 6) {
  static auto* cache = new std::map<std::pair<int, int>, std::vector<std::vector<uint32_t>>>();
  auto it = cache->find({max_tokens, count});
  if (it != cache->end()) return it->second;
  Daemon unified(With({}));
  EXPECT_TRUE(unified.WaitServing()) << unified.Log();
  std::vector<std::vector<uint32_t>> answers;
  for (const Generation& g : RunConcurrently(unified, count, max_tokens)) {
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
    answers.push_back(g.token_ids);
  }
  return (*cache)[{max_tokens, count}] = answers;
}

// The tandem_remote_handoffs_total series of `outcome` to `peer`.
std::string Handoffs(const std::string& outcome, const std::string& peer) {
  return absl::StrCat("tandem_remote_handoffs_total{outcome=\"", outcome, "\",peer=\"", peer,
                      "\"}");
}

double Metric(const Daemon& daemon, const std::string& series) {
  return MetricValue(HttpGet(daemon.metrics_port(), "/metrics").value_or(""), series).value_or(0);
}

bool Idle(Daemon& daemon) {
  return daemon.WaitForLoad([](const v1::Load& l) {
    return l.kv_used_blocks() == 0 && l.running_prefill() + l.running_decode() == 0 &&
           l.running_remote() == 0 && l.waiting() == 0 && l.open_calls() == 0;
  });
}

struct Pool {
  std::vector<std::unique_ptr<Daemon>> decoders;
  std::unique_ptr<Daemon> prefill;

  explicit Pool(int decode_daemons, std::vector<std::string> decode_flags = {},
                std::vector<std::string> prefill_flags = {}) {
    std::string peers;
    for (int d = 0; d < decode_daemons; ++d) {
      std::vector<std::string> flags = With({"--role=decode"});
      flags.insert(flags.end(), decode_flags.begin(), decode_flags.end());
      decoders.push_back(std::make_unique<Daemon>(flags));
      EXPECT_TRUE(decoders.back()->WaitServing()) << decoders.back()->Log();
      absl::StrAppend(&peers, peers.empty() ? "" : ",", decoders.back()->address());
    }
    std::vector<std::string> flags = With({"--role=prefill", absl::StrCat("--decode_peers=", peers),
                                           absl::StrCat("--disagg_output_threshold=", kThreshold)});
    flags.insert(flags.end(), prefill_flags.begin(), prefill_flags.end());
    prefill = std::make_unique<Daemon>(flags);
    EXPECT_TRUE(prefill->WaitServing()) << prefill->Log();
  }
};

TEST(MultiDaemonTest, GreedyAnswersAreTheUnifiedDaemonsAndTheBytesMovedAreThePages) {
  const auto& expected = Reference(40);
  Pool pool(1);
  const std::vector<Generation> got = RunConcurrently(*pool.prefill, 6, 40);
  double pages = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].token_ids, expected[i]) << "request " << i;
    EXPECT_EQ(got[i].last.path(), v1::PATH_REMOTE) << "request " << i;
    EXPECT_EQ(got[i].last.path_reason(), v1::PATH_REASON_THRESHOLD_REACHED);
    EXPECT_GT(got[i].last.timeline().kv_transfer_ms(), 0.0);
    EXPECT_GE(got[i].last.timeline().handoff_ms(), got[i].last.timeline().kv_transfer_ms());
    pages += HandedOffBlocks(static_cast<int>(i));
  }
  Daemon& decode = *pool.decoders[0];
  EXPECT_EQ(Metric(decode, "tandem_kv_transfer_bytes_total{direction=\"in\"}"),
            pages * kBytesPerBlock);
  EXPECT_EQ(Metric(*pool.prefill, "tandem_kv_transfer_bytes_total{direction=\"out\"}"),
            pages * kBytesPerBlock);
  EXPECT_EQ(Metric(*pool.prefill, Handoffs("committed", decode.address())), 6);
  EXPECT_EQ(Metric(*pool.prefill, "tandem_kv_transfer_time_seconds_count{path=\"remote\"}"), 6);
  EXPECT_EQ(Metric(decode, "tandem_kv_transfer_time_seconds_count{path=\"remote\"}"), 6);
  // Both requests' sides counted; nothing held anywhere afterwards.
  EXPECT_EQ(Metric(decode, "tandem_requests_total{finish_reason=\"length\",path=\"remote\"}"), 6);
  EXPECT_TRUE(Idle(*pool.prefill));
  EXPECT_TRUE(Idle(decode));
}

TEST(MultiDaemonTest, ThreeDaemonsSpreadTheHandoffsOverBothDecodeDaemons) {
  const auto& expected = Reference(40);
  Pool pool(2);
  const std::vector<Generation> got = RunConcurrently(*pool.prefill, 6, 40);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].token_ids, expected[i]) << "request " << i;
    EXPECT_EQ(got[i].last.path(), v1::PATH_REMOTE);
  }
  double total = 0;
  for (const auto& d : pool.decoders) {
    const double handoffs = Metric(*pool.prefill, Handoffs("committed", d->address()));
    EXPECT_GE(handoffs, 1) << d->address() << " got none";
    EXPECT_EQ(Metric(*d, "tandem_requests_total{finish_reason=\"length\",path=\"remote\"}"),
              handoffs);
    total += handoffs;
    EXPECT_TRUE(Idle(*d));
  }
  EXPECT_EQ(total, 6);
  EXPECT_TRUE(Idle(*pool.prefill));
}

TEST(MultiDaemonTest, KillingTheDecodeDaemonMidStreamLosesNoRequest) {
  const auto& expected = Reference(160, 4);
  Pool pool(1);
  std::vector<std::future<Generation>> futures;
  for (int i = 0; i < 4; ++i) {
    futures.push_back(std::async(std::launch::async, [&pool, i] {
      auto stub = pool.prefill->Stub();
      return Generate(*stub, Request(i, 160));
    }));
  }
  // All four decoding on the decode daemon, then it dies.
  ASSERT_TRUE(pool.prefill->WaitForLoad([](const v1::Load& l) { return l.running_remote() == 4; }))
      << pool.prefill->Log();
  ASSERT_TRUE(pool.decoders[0]->WaitForLoad(
      [](const v1::Load& l) { return l.running_prefill() + l.running_decode() == 4; }));
  EXPECT_EQ(pool.decoders[0]->Stop(SIGKILL), 128 + SIGKILL);
  for (int i = 0; i < 4; ++i) {
    const Generation g = futures[static_cast<size_t>(i)].get();
    ASSERT_TRUE(g.status.ok()) << "request " << i << ": " << g.status.error_message();
    EXPECT_EQ(g.token_ids, expected[static_cast<size_t>(i)]) << "request " << i;
  }
  EXPECT_EQ(Metric(*pool.prefill, Handoffs("failed", pool.decoders[0]->address())), 4);
  EXPECT_TRUE(Idle(*pool.prefill));
  // Later requests stay here (no peer is ready) and still succeed.
  auto stub = pool.prefill->Stub();
  const Generation after = Generate(*stub, Request(0, 40));
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.token_ids, Reference(40, 1)[0]);
}

TEST(MultiDaemonTest, WhenThePrefillDaemonDiesItsRequestsEndOnTheDecodeDaemon) {
  Pool pool(1);
  std::vector<std::future<Generation>> futures;
  for (int i = 0; i < 2; ++i) {
    futures.push_back(std::async(std::launch::async, [&pool, i] {
      auto stub = pool.prefill->Stub();
      return Generate(*stub, Request(i, 900));
    }));
  }
  ASSERT_TRUE(pool.decoders[0]->WaitForLoad([](const v1::Load& l) {
    return l.running_prefill() + l.running_decode() == 2;
  })) << "prefill daemon:\n"
      << pool.prefill->Log() << "\ndecode daemon:\n"
      << pool.decoders[0]->Log();
  EXPECT_EQ(pool.prefill->Stop(SIGKILL), 128 + SIGKILL);
  // The clients' streams fail as with a drain, after the tokens they had.
  for (auto& f : futures) {
    const Generation g = f.get();
    EXPECT_EQ(g.status.error_code(), grpc::StatusCode::UNAVAILABLE) << g.status.error_message();
    EXPECT_GE(g.token_ids.size(), static_cast<size_t>(kThreshold));
  }
  // The decode daemon noticed and let everything go.
  EXPECT_TRUE(Idle(*pool.decoders[0]));
  EXPECT_EQ(pool.decoders[0]->Health(), "SERVING");
}

TEST(MultiDaemonTest, AClientsAbortFreesThePagesOnBothDaemons) {
  Pool pool(1);
  grpc::ClientContext context;
  auto stub = pool.prefill->Stub();
  v1::GenerateRequest request = Request(2, 900);
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));
  ASSERT_TRUE(pool.prefill->WaitForLoad([](const v1::Load& l) { return l.running_remote() == 1; }));
  ASSERT_TRUE(pool.decoders[0]->WaitForLoad(
      [](const v1::Load& l) { return l.running_prefill() + l.running_decode() == 1; }));
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(Idle(*pool.prefill));
  EXPECT_TRUE(Idle(*pool.decoders[0]));
  EXPECT_EQ(Metric(*pool.decoders[0],
                   "tandem_cancelled_requests_total{cause=\"client\",stage=\"decode\"}"),
            1);
}

// After a handoff that failed: both daemons of a one-decoder pool are idle,
// and the next request (request 1) is handed off and answers `expected`.
void ExpectRecovered(Pool& pool, v1::Generation::Stub& stub,
                     const std::vector<uint32_t>& expected) {
  EXPECT_TRUE(Idle(*pool.prefill));
  EXPECT_TRUE(Idle(*pool.decoders[0]));
  const Generation next = Generate(stub, Request(1, 40));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.token_ids, expected);
  EXPECT_EQ(next.last.path(), v1::PATH_REMOTE);
}

TEST(MultiDaemonTest, ATransferThatFailsHalfWayFreesEverythingAndTheRequestGoesOnHere) {
  const auto& expected = Reference(40, 2);
  Pool pool(1, {"--inject_fault=kv_transfer:error@1"});
  auto stub = pool.prefill->Stub();
  const Generation first = Generate(*stub, Request(0, 40));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.token_ids, expected[0]);
  EXPECT_EQ(first.last.path(), v1::PATH_COLOCATED);  // it came back before any page was used
  Daemon& decode = *pool.decoders[0];
  EXPECT_EQ(
      Metric(decode, "tandem_kv_transfer_failures_total{direction=\"in\",reason=\"transfer\"}"), 1);
  EXPECT_EQ(Metric(*pool.prefill, Handoffs("failed", decode.address())), 1);
  ExpectRecovered(pool, *stub, expected[1]);
}

// The prefill daemon's KV transport answers only reads of the blocks it
// offered, to the peer it offered them to: a decode daemon that also asks
// for another block (an injected fault) has its read refused, reads
// nothing, and the request goes on on its prefill daemon with the same
// tokens; the next handoff works.
TEST(MultiDaemonTest, AReadOfABlockThatWasNotOfferedIsRefusedByThePrefillDaemon) {
  const auto& expected = Reference(40, 2);
  Pool pool(1, {"--inject_fault=kv_transfer:overread@1"});
  auto stub = pool.prefill->Stub();
  const Generation first = Generate(*stub, Request(0, 40));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.token_ids, expected[0]);
  EXPECT_EQ(first.last.path(), v1::PATH_COLOCATED);
  Daemon& decode = *pool.decoders[0];
  EXPECT_EQ(Metric(decode, "tandem_kv_transfer_failures_total{direction=\"in\",reason=\"denied\"}"),
            1);
  EXPECT_THAT(decode.Log(), ::testing::HasSubstr("the owner refused the read: range"));
  EXPECT_THAT(decode.Log(), ::testing::HasSubstr("was not granted"));
  EXPECT_EQ(Metric(*pool.prefill, Handoffs("failed", decode.address())), 1);
  ExpectRecovered(pool, *stub, expected[1]);
}

// A read whose source stops answering (an injected stall of 30 s, far past
// the 2 s lease) is cut off at the lease's end: the decode daemon closes its
// connection to the source, which fails the read, and frees the request's
// blocks, without waiting for the transport to give up; the request goes on
// on its prefill daemon with the same tokens, and the next handoff works.
// (The connection cut is the stand-in source's: the path that reconnects to
// a real prefill daemon after a cut is not exercised.)
TEST(MultiDaemonTest, ATransferStalledPastItsLeaseIsCutOffAndItsBlocksFreedWithinIt) {
  const auto& expected = Reference(40, 2);
  constexpr absl::Duration kLease = absl::Seconds(2);
  Pool pool(1, {"--inject_fault=kv_transfer:stall@1:30s"},
            {absl::StrCat("--kv_lease=", absl::FormatDuration(kLease))});
  Daemon& decode = *pool.decoders[0];
  auto stub = pool.prefill->Stub();
  auto first = std::async(std::launch::async, [&stub] { return Generate(*stub, Request(0, 40)); });
  // The decode daemon holds the request's blocks from the offer until the
  // read is cut off at the lease's end: no longer than the lease and a
  // second's slack (polling, and a sanitizer build's slower steps), far less
  // than the stall.
  auto decode_stub = decode.Stub();
  auto used_blocks = [&decode_stub] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::Load load;
    return decode_stub->GetLoad(&context, v1::GetLoadRequest(), &load).ok() ? load.kv_used_blocks()
                                                                            : -1;
  };
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (used_blocks() <= 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  const absl::Time held = absl::Now();
  while (used_blocks() != 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  const absl::Duration holding = absl::Now() - held;
  EXPECT_LE(holding, kLease + absl::Seconds(1)) << absl::FormatDuration(holding);

  const Generation g = first.get();
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.token_ids, expected[0]);
  EXPECT_EQ(g.last.path(), v1::PATH_COLOCATED);
  EXPECT_EQ(Metric(decode, "tandem_kv_transfer_failures_total{direction=\"in\",reason=\"lease\"}"),
            1);
  EXPECT_THAT(decode.Log(), ::testing::HasSubstr("has not finished within its lease"));
  ExpectRecovered(pool, *stub, expected[1]);  // the next handoff reads its pages
}

// The same cut against a real prefill daemon whose KV transport stops
// answering (an injected stall of its agent from the second offer on, 4 s,
// past the 2 s lease): the decode daemon cuts its connection at the lease's
// end, the request goes on on the prefill daemon with the same tokens, and
// once the transport answers again the next handoff connects anew and reads
// its pages. Neither daemon minds the connection that was cut.
TEST(MultiDaemonTest, AfterACutTheDecodeDaemonConnectsAgainToTheSamePrefillDaemon) {
  const auto& expected = Reference(40, 3);
  Pool pool(1, {}, {"--kv_lease=2s", "--inject_fault=kv_transfer:stall@2:4s"});
  Daemon& decode = *pool.decoders[0];
  auto stub = pool.prefill->Stub();
  const Generation before = Generate(*stub, Request(0, 40));
  ASSERT_TRUE(before.status.ok()) << before.status.error_message();
  EXPECT_EQ(before.token_ids, expected[0]);
  EXPECT_EQ(before.last.path(), v1::PATH_REMOTE);

  const absl::Time stalled = absl::Now();
  const Generation cut = Generate(*stub, Request(1, 40));
  ASSERT_TRUE(cut.status.ok()) << cut.status.error_message();
  EXPECT_EQ(cut.token_ids, expected[1]);
  EXPECT_EQ(cut.last.path(), v1::PATH_COLOCATED);
  EXPECT_EQ(Metric(decode, "tandem_kv_transfer_failures_total{direction=\"in\",reason=\"lease\"}"),
            1);
  EXPECT_TRUE(Idle(decode));

  // Past the stall (a fixed 4 s from the second offer: a clock, not this
  // machine's speed), the third request is handed off over a new connection.
  absl::SleepFor(stalled + absl::Seconds(4) - absl::Now() + absl::Milliseconds(100));
  const Generation after = Generate(*stub, Request(2, 40));
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.token_ids, expected[2]);
  EXPECT_EQ(after.last.path(), v1::PATH_REMOTE);
  EXPECT_TRUE(Idle(*pool.prefill));
  EXPECT_TRUE(Idle(decode));
  EXPECT_EQ(pool.prefill->Health(), "SERVING");
  EXPECT_EQ(decode.Health(), "SERVING");
}

TEST(MultiDaemonTest, PagesWhoseLeaseExpiredAreNeverDecodedFrom) {
  const auto& expected = Reference(40, 1);
  // The lease runs out long before any read can finish.
  Pool pool(1, {}, {"--kv_lease=1us"});
  auto stub = pool.prefill->Stub();
  const Generation g = Generate(*stub, Request(0, 40));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.token_ids, expected[0]);
  EXPECT_EQ(g.last.path(), v1::PATH_COLOCATED);
  Daemon& decode = *pool.decoders[0];
  EXPECT_EQ(Metric(*pool.prefill, "tandem_kv_lease_expirations_total"), 1);
  EXPECT_EQ(Metric(*pool.prefill, "tandem_kv_transfer_bytes_total{direction=\"out\"}"), 0);
  EXPECT_EQ(Metric(decode, "tandem_requests_total{finish_reason=\"length\",path=\"remote\"}"), 0);
  EXPECT_TRUE(Idle(*pool.prefill));
  EXPECT_TRUE(Idle(decode));
}

// Sends `control` (a handoff) to `decode`'s Peer service as a prefill daemon
// would, and returns how the decode daemon ends the stream. The stream stays
// open until it does, as a prefill daemon's does (it answers the lease on
// it): a half-close would race the answer with "the prefill daemon went
// away" (CANCELLED).
grpc::Status SendHandoff(Daemon& decode, const v1::DecodeControl& control) {
  auto peer =
      v1::Peer::NewStub(grpc::CreateChannel(decode.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = peer->Decode(&context);
  if (!stream->Write(control)) return stream->Finish();
  v1::DecodeEvent event;
  while (stream->Read(&event)) {
  }
  return stream->Finish();
}

// A handoff is input from another process: token ids outside the model's
// vocabulary (which would index past the embedding table) are refused with
// the field named, before any block is reserved, and the daemon serves on.
TEST(MultiDaemonTest, AHandoffWithATokenOutsideTheVocabularyIsRefusedByField) {
  Daemon decode(With({"--role=decode"}));
  ASSERT_TRUE(decode.WaitServing()) << decode.Log();
  constexpr uint32_t kVocab = 49152;  // SmolLM2-135M
  for (const auto& [field, bad_id] : std::vector<std::pair<std::string, uint32_t>>{
           {"token_ids[2]", kVocab}, {"stop_token_ids[1]", kVocab + 7}}) {
    v1::DecodeControl control;
    v1::HandoffRequest* h = control.mutable_handoff();
    h->set_request_id("bad-" + field);
    for (uint32_t id : {1u, 2u, field == "token_ids[2]" ? bad_id : 3u, 4u}) h->add_token_ids(id);
    h->set_prompt_tokens(3);
    h->set_top_p(1.0f);  // greedy, valid: only the token id is wrong
    h->set_max_tokens(8);
    h->add_stop_token_ids(2);
    h->add_stop_token_ids(field == "stop_token_ids[1]" ? bad_id : 0u);
    const grpc::Status status = SendHandoff(decode, control);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(),
                ::testing::HasSubstr(field + ": token id " + std::to_string(bad_id) +
                                     " is outside the vocabulary"));
  }
  EXPECT_EQ(
      Metric(decode, "tandem_kv_transfer_failures_total{direction=\"in\",reason=\"refused\"}"), 2);
  EXPECT_TRUE(Idle(decode));
  EXPECT_EQ(decode.Health(), "SERVING");
}

// Daemons whose products round differently (the decode daemon's
// --cpu_matmul=q8, the prefill daemon's f32) hand nothing to each other: the
// prefill daemon never chooses that peer, logs why, and serves the request
// itself with its own tokens; a handoff sent anyway is refused naming both.
TEST(MultiDaemonTest, DaemonsWhoseProductsRoundDifferentlyHandNothingToEachOther) {
  Pool pool(1, {"--cpu_matmul=q8"});
  Daemon& decode = *pool.decoders[0];
  Daemon& prefill = *pool.prefill;
  auto load_of = [](Daemon& daemon) {
    v1::Load load;
    grpc::ClientContext context;
    EXPECT_TRUE(daemon.Stub()->GetLoad(&context, v1::GetLoadRequest(), &load).ok());
    return load;
  };
  const std::string theirs = load_of(decode).arithmetic(), ours = load_of(prefill).arithmetic();
  EXPECT_THAT(theirs, ::testing::MatchesRegex("cpu-[a-z0-9+]+/q8/r[0-9]+"));
  EXPECT_THAT(ours, ::testing::MatchesRegex("cpu-[a-z0-9]+/f32/r[0-9]+"));

  auto stub = prefill.Stub();
  const Generation g = Generate(*stub, Request(0, 40));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.token_ids, Reference(40, 1)[0]);
  EXPECT_EQ(Metric(prefill, Handoffs("no_peer", "none")), 1);
  EXPECT_THAT(prefill.Log(), ::testing::HasSubstr("not used: its products round as '" + theirs +
                                                  "', this daemon's as '" + ours + "'"));

  v1::DecodeControl control;
  v1::HandoffRequest* h = control.mutable_handoff();
  h->set_request_id("other-arithmetic");
  for (uint32_t id : {1u, 2u, 3u, 4u}) h->add_token_ids(id);
  h->set_prompt_tokens(3);
  h->set_top_p(1.0f);
  h->set_max_tokens(8);
  h->mutable_kv()->set_arithmetic(ours);
  const grpc::Status status = SendHandoff(decode, control);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_THAT(status.error_message(),
              ::testing::HasSubstr("kv.arithmetic: the prefill daemon's products round as '" +
                                   ours + "' and this daemon's as '" + theirs + "'"));
  EXPECT_EQ(
      Metric(decode, "tandem_kv_transfer_failures_total{direction=\"in\",reason=\"refused\"}"), 1);
  EXPECT_TRUE(Idle(decode));
  EXPECT_TRUE(Idle(prefill));
}

TEST(MultiDaemonTest, ADecodeDaemonTakesNoPromptsAndAMissingPeerCostsNoRequest) {
  Daemon decode(With({"--role=decode"}));
  ASSERT_TRUE(decode.WaitServing()) << decode.Log();
  auto stub = decode.Stub();
  const Generation refused = Generate(*stub, Request(0, 8));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.status.error_message(), ::testing::HasSubstr("--role=decode"));
  v1::Load load;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->GetLoad(&context, v1::GetLoadRequest(), &load).ok());
  EXPECT_FALSE(load.accepts_prompts());

  // A prefill daemon whose only peer does not answer serves everything itself.
  Daemon alone(
      With({"--role=prefill", absl::StrCat("--decode_peers=127.0.0.1:", FreeLoopbackPort()),
            "--disagg_output_threshold=8"}));
  ASSERT_TRUE(alone.WaitServing()) << alone.Log();
  auto alone_stub = alone.Stub();
  const Generation g = Generate(*alone_stub, Request(0, 40));
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.token_ids, Reference(40, 1)[0]);
  EXPECT_EQ(Metric(alone, "tandem_remote_handoffs_total{outcome=\"no_peer\",peer=\"none\"}"), 1);
  EXPECT_TRUE(Idle(alone));
}

// Under --api_keys_file the Peer service needs a key like every RPC; a
// prefill daemon presents the first of its own keys to its peers (and a
// prefill daemon without the key finds no peer, so it serves everything).
TEST(MultiDaemonTest, WithApiKeysThePrefillDaemonPresentsItsKeyToItsPeers) {
  const std::string keys = ::testing::TempDir() + "/multi_daemon_keys";
  std::ofstream(keys) << "pool-key\n";
  const std::string flag = absl::StrCat("--api_keys_file=", keys);
  for (const bool prefill_has_key : {true, false}) {
    Pool pool(1, {flag},
              prefill_has_key ? std::vector<std::string>{flag} : std::vector<std::string>{});
    auto stub = pool.prefill->Stub();
    grpc::ClientContext context;
    if (prefill_has_key) context.AddMetadata("authorization", "Bearer pool-key");
    auto reader = stub->Generate(&context, Request(0, 40));
    v1::GenerateResponse message, last;
    std::vector<uint32_t> tokens;
    while (reader->Read(&message)) {
      tokens.insert(tokens.end(), message.token_ids().begin(), message.token_ids().end());
      last = message;
    }
    const grpc::Status status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(tokens, Reference(40, 1)[0]);
    EXPECT_EQ(last.path(), prefill_has_key ? v1::PATH_REMOTE : v1::PATH_COLOCATED)
        << "prefill daemon with the key: " << prefill_has_key;
  }
}

// Two CAs (the pool's and another) and certificates: "decode" (for
// 127.0.0.1) and "prefill" signed by the pool's CA, "rogue" (for 127.0.0.1
// too) by the other. Returns the directory.
std::string MakePoolCertificates() {
  const std::string dir = ::testing::TempDir() + "/peer_tls_" + std::to_string(FreeLoopbackPort());
  std::string script = "set -e; mkdir -p " + dir + "; cd " + dir +
                       "; printf 'subjectAltName=IP:127.0.0.1' > san.ext";
  for (const char* ca : {"pool-ca", "other-ca"}) {
    absl::StrAppend(&script, "; openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=", ca,
                    " -keyout ", ca, ".key -out ", ca, ".pem 2>/dev/null");
  }
  for (const auto& [name, ca] : {std::pair{"decode", "pool-ca"}, std::pair{"prefill", "pool-ca"},
                                 std::pair{"rogue", "other-ca"}}) {
    absl::StrAppend(&script, "; openssl req -newkey rsa:2048 -nodes -subj /CN=", name, " -keyout ",
                    name, ".key -out ", name, ".csr 2>/dev/null", "; openssl x509 -req -in ", name,
                    ".csr -CA ", ca, ".pem -CAkey ", ca,
                    ".key -CAcreateserial -days 2 -extfile san.ext -out ", name,
                    ".pem 2>/dev/null");
  }
  EXPECT_EQ(std::system(("bash -c \"" + script + "\"").c_str()), 0);
  return dir;
}

// --peer_tls_* flags for certificate `name` and CA `ca` in `dir`.
std::vector<std::string> PeerTls(const std::string& dir, const std::string& name,
                                 const std::string& ca = "pool-ca") {
  return {absl::StrCat("--peer_tls_cert=", dir, "/", name, ".pem"),
          absl::StrCat("--peer_tls_key=", dir, "/", name, ".key"),
          absl::StrCat("--peer_tls_ca=", dir, "/", ca, ".pem")};
}

// The Peer service on a port of its own under mutual TLS: a prefill daemon
// with the pool CA's certificate hands off; one with another CA's
// certificate, or none, is refused by the decode daemon, and a decode daemon
// with another CA's certificate is refused by the prefill daemon (each
// request then runs where it entered, with the same tokens). --listen no
// longer serves Peer. The pages move over the transport ports given.
TEST(MultiDaemonTest, PeersOnTheirOwnPortRefuseAnyCertificateThePoolsCaDidNotSign) {
  const std::string dir = MakePoolCertificates();
  const std::vector<uint32_t>& expected = Reference(40, 1)[0];
  struct Case {
    std::string name;
    std::string decode_cert;
    std::vector<std::string> prefill_tls;  // none: plaintext
    v1::Path path;
  };
  const std::vector<Case> cases = {
      {"both signed by the pool's CA", "decode", PeerTls(dir, "prefill"), v1::PATH_REMOTE},
      {"the prefill daemon's certificate from another CA", "decode", PeerTls(dir, "rogue"),
       v1::PATH_COLOCATED},
      {"the prefill daemon without TLS", "decode", {}, v1::PATH_COLOCATED},
      {"the decode daemon's certificate from another CA", "rogue", PeerTls(dir, "prefill"),
       v1::PATH_COLOCATED},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int peer_port = FreeLoopbackPort();
    // Each KV transport on a port of its own range (--kv_transport_ports),
    // as a NetworkPolicy would open it.
    const int decode_transport = FreeLoopbackPort(), prefill_transport = FreeLoopbackPort();
    std::vector<std::string> decode_flags =
        With({"--role=decode", absl::StrCat("--peer_listen=127.0.0.1:", peer_port),
              absl::StrCat("--kv_transport_ports=", decode_transport, "-", decode_transport)});
    for (const std::string& f : PeerTls(dir, c.decode_cert)) decode_flags.push_back(f);
    Daemon decode(decode_flags);
    ASSERT_TRUE(decode.WaitServing()) << decode.Log();
    std::vector<std::string> prefill_flags =
        With({"--role=prefill", absl::StrCat("--decode_peers=127.0.0.1:", peer_port),
              absl::StrCat("--disagg_output_threshold=", kThreshold),
              absl::StrCat("--kv_transport_ports=", prefill_transport, "-", prefill_transport)});
    prefill_flags.insert(prefill_flags.end(), c.prefill_tls.begin(), c.prefill_tls.end());
    Daemon prefill(prefill_flags);
    ASSERT_TRUE(prefill.WaitServing()) << prefill.Log();
    auto stub = prefill.Stub();
    const Generation g = Generate(*stub, Request(0, 40));
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.token_ids, expected);
    EXPECT_EQ(g.last.path(), c.path) << prefill.Log();
    EXPECT_TRUE(Idle(prefill));
    EXPECT_TRUE(Idle(decode));
    if (c.path == v1::PATH_REMOTE) {
      // The client port answers Generation only.
      auto peer_on_listen = v1::Peer::NewStub(
          grpc::CreateChannel(decode.address(), grpc::InsecureChannelCredentials()));
      grpc::ClientContext context;
      v1::Load load;
      EXPECT_EQ(peer_on_listen->GetLoad(&context, v1::GetLoadRequest(), &load).error_code(),
                grpc::StatusCode::UNIMPLEMENTED);
    }
  }
}

// One daemon whose decode worker keeps its KV in storage of its own (what a
// GPU beside the CPU needs): handoffs move pages through the same seam.
TEST(MultiDaemonTest, TwoWorkersWithSeparateKvStoragesAnswerAsOneWithSharedStorage) {
  const auto& expected = Reference(40);
  Daemon daemon(With({"--disagg_output_threshold=8", "--decode_kv_cache_bytes=67108864"}));
  ASSERT_TRUE(daemon.WaitServing()) << daemon.Log();
  const std::vector<Generation> got = RunConcurrently(daemon, 6, 40);
  double pages = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].token_ids, expected[i]) << "request " << i;
    EXPECT_EQ(got[i].last.path(), v1::PATH_DISAGGREGATED);
    EXPECT_GT(got[i].last.timeline().kv_transfer_ms(), 0.0);
    pages += HandedOffBlocks(static_cast<int>(i));
  }
  EXPECT_EQ(Metric(daemon, "tandem_kv_transfer_bytes_total{direction=\"internal\"}"),
            pages * kBytesPerBlock);
  EXPECT_EQ(Metric(daemon, "tandem_kv_cache_blocks"), 2 * 182);  // both pools
  EXPECT_TRUE(Idle(daemon));
}

TEST(MultiDaemonTest, BadRoleFlagsStopTheDaemonNamingThem) {
  ExpectStartupErrors({
      {{"--role=both"}, 2, "--role='both'"},
      {{"--role=prefill"}, 2, "--decode_peers"},
      {{"--role=prefill", "--decode_peers=peer-without-port"}, 2, "peer-without-port"},
      {{"--decode_peers=127.0.0.1:1"}, 2, "--decode_peers is for --role=prefill"},
      {{"--role=prefill", "--decode_peers=127.0.0.1:1", "--disagg_output_threshold=off"},
       2,
       "--role=prefill needs --disagg_output_threshold"},
      {{"--inject_fault=kv_transfer:error@1"},
       2,
       "kv_transfer takes error@N, stall@N:DURATION or overread@N on a --role=decode daemon"},
      {{"--role=decode", "--kv_transport=nonexistent_transport"}, 1, "--kv_transport"},
      {{"--peer_listen=127.0.0.1:1"}, 2, "--peer_listen is for --role=decode"},
      {{"--role=prefill", "--decode_peers=127.0.0.1:1", "--peer_tls_ca=/x"},
       2,
       "--peer_tls_cert, --peer_tls_key and --peer_tls_ca go together"},
      {{"--role=decode", "--peer_tls_cert=/a", "--peer_tls_key=/b", "--peer_tls_ca=/c"},
       2,
       "--peer_tls_* on --role=decode need --peer_listen"},
      {{"--role=decode", "--peer_listen=127.0.0.1:0", "--peer_tls_cert=/nonexistent.pem",
        "--peer_tls_key=/b", "--peer_tls_ca=/c"},
       2,
       "--peer_tls_cert"},
      {{"--decode_kv_cache_bytes=67108864", "--disagg_output_threshold=off"},
       2,
       "--decode_kv_cache_bytes=67108864: needs a decode worker"},
      {{"--decode_kv_cache_bytes=1048576"}, 1, "--decode_kv_cache_bytes=1048576 holds 2 blocks"},
  });
}

}  // namespace
}  // namespace tandem::testing
