// KV handoff cost between two processes: a child process owns a paged KV
// storage of the default model's shape (SmolLM2-135M: 30 layers, 3 KV heads
// of 64, 16-token blocks: 360 KiB per block) and the parent reads N scattered
// blocks from it through the UCX agent, as a decode daemon pulls a request's
// pages from a prefill daemon. Prints, per transport and block count, the
// median and min/max time of a handoff (post to completion, notification
// sent) and the bandwidth it implies.
//
//   build/bin/tandem-kv-transfer-bench [--transports=tcp] [--blocks=1,8,64] [--repeats=21]
//
// Only TCP here: the agent asks UCX to detect a dead peer (a lease must not
// wait forever), and Debian's UCX 1.13 shared-memory transports cannot, so
// UCX refuses them for such connections ("no peer failure handler").
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kvtransfer/kv_pages.h"
#include "kvtransfer/ucx_agent.h"

ABSL_FLAG(std::string, transports, "tcp", "UCX transports to measure, each on its own");
ABSL_FLAG(std::string, blocks, "1,8,64", "blocks per handoff");
ABSL_FLAG(int, repeats, 21, "handoffs per measurement");
ABSL_FLAG(int, pool_blocks, 256, "blocks in each side's KV storage");

namespace tandem {
namespace {

kernels::KvCacheShape Shape(int blocks) {
  kernels::KvCacheShape shape;
  shape.layers = 30;
  shape.blocks = blocks;
  shape.block_size = 16;
  shape.kv_heads = 3;
  shape.head_dim = 64;
  return shape;
}

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "tandem-kv-transfer-bench: %s\n", what.c_str());
  std::exit(1);
}

size_t StorageBytes() {
  const kernels::KvCacheShape shape = Shape(absl::GetFlag(FLAGS_pool_blocks));
  return shape.BytesPerBlock() * static_cast<size_t>(shape.blocks);
}

// A UCX agent on `transport` with `storage` registered as its region 0.
std::unique_ptr<kvtransfer::TransferAgent> StartAgent(const std::string& transport,
                                                      std::vector<char>& storage) {
  auto agent = kvtransfer::CreateUcxAgent({.transports = transport, .tcp_ports = ""});
  if (!agent.ok()) Fail(agent.status().ToString());
  if (!(*agent)->RegisterMemory(storage.data(), storage.size(), kvtransfer::MemoryKind::kHost).ok())
    Fail("register");
  return *std::move(agent);
}

void WriteBlob(int out, const std::string& blob) {
  const uint64_t size = blob.size();
  if (write(out, &size, sizeof(size)) != sizeof(size) ||
      write(out, blob.data(), size) != static_cast<ssize_t>(size)) {
    Fail("pipe");
  }
}

std::string ReadBlob(int in) {
  uint64_t size = 0;
  if (read(in, &size, sizeof(size)) != sizeof(size)) Fail("the owner did not start");
  std::string blob(size, '\0');
  for (size_t got = 0; got < size;) {
    const ssize_t n = read(in, blob.data() + got, size - got);
    if (n <= 0) Fail("pipe");
    got += static_cast<size_t>(n);
  }
  return blob;
}

// The owner: registers its storage, grants reads of all of it (a daemon
// grants each offer's blocks), writes its metadata and the grant's token
// to `out` and waits until the parent closes `done`.
[[noreturn]] void Owner(const std::string& transport, int out, int done) {
  std::vector<char> storage(StorageBytes(), 1);
  std::unique_ptr<kvtransfer::TransferAgent> agent = StartAgent(transport, storage);
  absl::StatusOr<std::string> metadata = agent->LocalMetadata();
  if (!metadata.ok()) Fail(metadata.status().ToString());
  const kvtransfer::Descriptor all{0, 0, storage.size()};
  absl::StatusOr<kvtransfer::ReadGrant> grant =
      agent->GrantReads({&all, 1}, absl::InfiniteFuture());
  if (!grant.ok()) Fail(grant.status().ToString());
  WriteBlob(out, *metadata);
  WriteBlob(out, grant->token);
  char byte;
  while (read(done, &byte, 1) > 0) {
  }
  _exit(0);
}

void Measure(const std::string& transport, const std::vector<int>& block_counts) {
  int to_parent[2], to_child[2];
  if (pipe(to_parent) != 0 || pipe(to_child) != 0) Fail("pipe");
  const pid_t child = fork();
  if (child == 0) {
    close(to_parent[0]);
    close(to_child[1]);
    Owner(transport, to_parent[1], to_child[0]);
  }
  close(to_parent[1]);
  close(to_child[0]);
  const std::string metadata = ReadBlob(to_parent[0]);
  const std::string token = ReadBlob(to_parent[0]);

  const kernels::KvCacheShape shape = Shape(absl::GetFlag(FLAGS_pool_blocks));
  std::vector<char> storage(StorageBytes(), 0);
  std::unique_ptr<kvtransfer::TransferAgent> agent = StartAgent(transport, storage);
  absl::StatusOr<kvtransfer::PeerId> peer = agent->AddPeer(metadata);
  if (!peer.ok()) Fail(peer.status().ToString());

  std::mt19937 random(7);
  std::vector<int32_t> ids(static_cast<size_t>(shape.blocks));
  for (int b = 0; b < shape.blocks; ++b) ids[static_cast<size_t>(b)] = b;
  for (int blocks : block_counts) {
    std::vector<double> ms;
    for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
      // Scattered blocks on both sides, as a paged cache holds them.
      std::shuffle(ids.begin(), ids.end(), random);
      std::vector<int32_t> remote(ids.begin(), ids.begin() + blocks);
      std::shuffle(ids.begin(), ids.end(), random);
      std::vector<int32_t> local(ids.begin(), ids.begin() + blocks);
      auto reads = kvtransfer::PlanKvPageReads(shape, 0, local, shape, 0, remote);
      if (!reads.ok()) Fail(reads.status().ToString());
      const absl::Time start = absl::Now();
      auto id = agent->PostRead(*peer, reads->local, reads->remote, token, "done");
      if (!id.ok()) Fail(id.status().ToString());
      kvtransfer::TransferStatus status = agent->Poll(*id);
      while (status.state == kvtransfer::TransferState::kInProgress) {
        status = agent->Poll(*id);
      }
      if (status.state != kvtransfer::TransferState::kDone) Fail(status.error.ToString());
      ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
      agent->Release(*id);
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    const double bytes = static_cast<double>(blocks) * static_cast<double>(shape.BytesPerBlock());
    std::printf("%-4s %4d blocks %9.2f MiB  median %8.3f ms (min %8.3f, max %8.3f)  %6.2f GB/s\n",
                transport.c_str(), blocks, bytes / (1 << 20), median, ms.front(), ms.back(),
                bytes / (median / 1000) / 1e9);
  }
  agent.reset();
  close(to_child[1]);
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int> blocks;
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_blocks), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(b, &n) || n < 1 || n > absl::GetFlag(FLAGS_pool_blocks)) {
      std::fprintf(stderr, "--blocks: each must be 1..--pool_blocks\n");
      return 2;
    }
    blocks.push_back(n);
  }
  std::printf("KV handoff between two processes, SmolLM2-135M's page shape (%zu KiB per block)\n",
              tandem::Shape(1).BytesPerBlock() >> 10);
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_transports), ',')) {
    tandem::Measure(std::string(t), blocks);
  }
  return 0;
}
