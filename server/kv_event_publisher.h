// Publishes the prefix index's events (kvcache/kv_event.h) over ZeroMQ, in
// the format vLLM's engines send and llm-d's KV-cache indexer decodes, so
// that a cache-aware router can send each prompt to the daemon that holds
// its prefix.
//
// Wire format (docs/operations.md, "KV events", says it for operators):
//   A PUB socket bound at `endpoint`. Each message has three frames:
//     topic    "kv@<pod>@<model>"
//     sequence uint64, big-endian: 0 for the first message, then +1
//     payload  msgpack [timestamp (float64, seconds since the epoch),
//                       [event, ...], data_parallel_rank (0)]
//   Events, msgpack arrays tagged by their first element:
//     ["BlockStored", [hash, ...], parent hash or nil, [token id, ...],
//      block_size, nil (LoRA id), nil (medium)]
//     ["BlockRemoved", [hash, ...], nil (medium)]
//     ["AllBlocksCleared"]
//   A hash is a uint64: the first 8 bytes of the block's SHA-256 key
//   (kvcache/block_hash.h), big-endian.
//   Message 0 is ["AllBlocksCleared"]: a router drops what an earlier run
//   of this daemon published under the same topic.
//
// Replay (a ROUTER socket bound at `replay_endpoint`, optional): a request
// whose last frame is a sequence number (8 bytes, big-endian) is answered
// with every retained message from that number on, one reply per message
// ([sequence, payload] after the request's envelope), then an end marker
// (sequence -1, empty payload). The last `replay_messages` are retained.
// Several replies to one request: clients use DEALER (REQ takes one).
//
// Publish() never blocks: batches wait in a bounded queue for the
// publisher's thread, which encodes and sends them. A full queue drops the
// batch (counted) and Publish() answers false: the scheduler then sends the
// whole index instead of its next batch (SchedulerOptions::on_kv_events).
// A slow subscriber loses messages at ZeroMQ's high-water mark (PUB never
// blocks) and can ask the replay socket for them.
#ifndef TANDEM_SERVER_KV_EVENT_PUBLISHER_H_
#define TANDEM_SERVER_KV_EVENT_PUBLISHER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvcache/kv_event.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace tandem::server {

struct KvEventPublisherOptions {
  std::string endpoint;         // "tcp://*:5557", "ipc:///run/tandem/kv-events"
  std::string replay_endpoint;  // "": no replay socket
  std::string topic;            // "kv@<pod>@<model>"
  int32_t block_size = 16;
  int32_t replay_messages = 10000;
  int32_t max_queued_batches = 4096;
};

class KvEventPublisher {
 public:
  // Binds the sockets (InvalidArgument naming the endpoint when one cannot
  // be bound) and starts the thread. Counters go to `registry`.
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Start(KvEventPublisherOptions options,
                                                                 prometheus::Registry& registry);
  ~KvEventPublisher();  // sends what is queued, then closes the sockets
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Queues one batch (one scheduler round's events). Any thread; never
  // blocks. False: the queue was full and the batch is dropped.
  bool Publish(std::vector<kvcache::KvEvent> events);

 private:
  struct Batch {
    absl::Time time;
    std::vector<kvcache::KvEvent> events;
  };
  struct Sockets;

  KvEventPublisher(KvEventPublisherOptions options, std::unique_ptr<Sockets> sockets,
                   prometheus::Registry& registry);
  void Run();
  void Send(const Batch& batch);
  void AnswerReplay();

  const KvEventPublisherOptions options_;
  std::unique_ptr<Sockets> sockets_;  // the thread's alone once it runs
  prometheus::Counter& published_;
  prometheus::Counter& dropped_;
  prometheus::Counter& replayed_;
  uint64_t next_sequence_ = 0;                             // the thread's
  std::deque<std::pair<uint64_t, std::string>> retained_;  // the thread's
  absl::Mutex mu_;
  std::deque<Batch> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// The payload of one message (the wire format above): for tests and tools.
std::string EncodeKvEventBatch(absl::Time time, const std::vector<kvcache::KvEvent>& events,
                               int32_t block_size);

// The uint64 a block hash goes out as.
uint64_t PublishedBlockHash(const kvcache::BlockHash& hash);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_KV_EVENT_PUBLISHER_H_
