#include "server/kv_event_publisher.h"

#include <msgpuck.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "prometheus/family.h"
#include "spdlog/spdlog.h"

namespace tandem::server {
namespace {

// A msgpack document built value by value (msgpuck encodes into a buffer
// it is given; this one grows).
class MsgpackWriter {
 public:
  void Array(uint32_t size) {
    Put(mp_sizeof_array(size), [&](char* at) { return mp_encode_array(at, size); });
  }
  void Uint(uint64_t value) {
    Put(mp_sizeof_uint(value), [&](char* at) { return mp_encode_uint(at, value); });
  }
  void Double(double value) {
    Put(mp_sizeof_double(value), [&](char* at) { return mp_encode_double(at, value); });
  }
  void Nil() {
    Put(mp_sizeof_nil(), [](char* at) { return mp_encode_nil(at); });
  }
  void Str(std::string_view text) {
    const auto size = static_cast<uint32_t>(text.size());
    Put(mp_sizeof_str(size), [&](char* at) { return mp_encode_str(at, text.data(), size); });
  }
  std::string Take() { return std::move(out_); }

 private:
  template <typename Encode>
  void Put(size_t most, Encode encode) {
    const size_t at = out_.size();
    out_.resize(at + most);
    char* end = encode(out_.data() + at);
    out_.resize(static_cast<size_t>(end - out_.data()));
  }
  std::string out_;
};

std::array<char, 8> BigEndian(uint64_t value) {
  std::array<char, 8> bytes;
  for (int i = 0; i < 8; ++i)
    bytes[static_cast<size_t>(i)] = static_cast<char>(value >> (56 - 8 * i));
  return bytes;
}

std::optional<uint64_t> FromBigEndian(const zmq_msg_t& frame) {
  if (zmq_msg_size(const_cast<zmq_msg_t*>(&frame)) != 8) return std::nullopt;
  const auto* bytes =
      static_cast<const unsigned char*>(zmq_msg_data(const_cast<zmq_msg_t*>(&frame)));
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | bytes[i];
  return value;
}

prometheus::Family<prometheus::Counter>& BatchFamily(prometheus::Registry& registry) {
  return prometheus::BuildCounter()
      .Name("tandem_kv_events_batches_total")
      .Help(
          "KV event batches (one scheduler round each): published on the PUB socket, or "
          "dropped for a full queue (the next batch then carries the whole index)")
      .Register(registry);
}

}  // namespace

uint64_t PublishedBlockHash(const kvcache::BlockHash& hash) {
  // words[0] holds the digest's first 8 bytes little-endian.
  return __builtin_bswap64(hash.words[0]);
}

std::string EncodeKvEventBatch(absl::Time time, const std::vector<kvcache::KvEvent>& events,
                               int32_t block_size) {
  using Kind = kvcache::KvEvent::Kind;
  MsgpackWriter w;
  w.Array(3);
  w.Double(absl::ToDoubleSeconds(time - absl::UnixEpoch()));
  w.Array(static_cast<uint32_t>(events.size()));
  for (const kvcache::KvEvent& e : events) {
    switch (e.kind) {
      case Kind::kStored:
        w.Array(7);
        w.Str("BlockStored");
        w.Array(static_cast<uint32_t>(e.hashes.size()));
        for (const kvcache::BlockHash& h : e.hashes) w.Uint(PublishedBlockHash(h));
        if (e.parent.has_value()) {
          w.Uint(PublishedBlockHash(*e.parent));
        } else {
          w.Nil();
        }
        w.Array(static_cast<uint32_t>(e.tokens.size()));
        for (kvcache::TokenId t : e.tokens) w.Uint(static_cast<uint32_t>(t));
        w.Uint(static_cast<uint64_t>(block_size));
        w.Nil();  // LoRA id: none
        w.Nil();  // medium: the one KV storage
        break;
      case Kind::kRemoved:
        w.Array(3);
        w.Str("BlockRemoved");
        w.Array(static_cast<uint32_t>(e.hashes.size()));
        for (const kvcache::BlockHash& h : e.hashes) w.Uint(PublishedBlockHash(h));
        w.Nil();
        break;
      case Kind::kAllCleared:
        w.Array(1);
        w.Str("AllBlocksCleared");
        break;
    }
  }
  w.Uint(0);  // data-parallel rank: one engine per daemon
  return w.Take();
}

// The ZeroMQ context, its sockets and the thread's wake-up (an eventfd the
// thread polls beside the replay socket).
struct KvEventPublisher::Sockets {
  ~Sockets() {
    if (pub != nullptr) zmq_close(pub);
    if (replay != nullptr) zmq_close(replay);
    if (context != nullptr) zmq_ctx_term(context);
    if (wake >= 0) close(wake);
  }
  void* context = nullptr;
  void* pub = nullptr;
  void* replay = nullptr;
  int wake = -1;
};

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Start(
    KvEventPublisherOptions options, prometheus::Registry& registry) {
  auto sockets = std::make_unique<Sockets>();
  sockets->context = zmq_ctx_new();
  sockets->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (sockets->context == nullptr || sockets->wake < 0) {
    return absl::InternalError("cannot create the KV events' ZeroMQ context");
  }
  auto bind = [&](int type, const std::string& endpoint, const char* flag,
                  void*& socket) -> absl::Status {
    socket = zmq_socket(sockets->context, type);
    // Close at once on shutdown after a short flush: a daemon that stops
    // does not wait for a subscriber that is gone.
    const int linger_ms = 500;
    zmq_setsockopt(socket, ZMQ_LINGER, &linger_ms, sizeof(linger_ms));
    if (type == ZMQ_ROUTER) {
      const int unlimited = 0;  // a replay is bounded by the retained messages
      zmq_setsockopt(socket, ZMQ_SNDHWM, &unlimited, sizeof(unlimited));
    }
    if (zmq_bind(socket, endpoint.c_str()) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, "='", endpoint, "': cannot bind: ", zmq_strerror(zmq_errno())));
    }
    return absl::OkStatus();
  };
  if (absl::Status s = bind(ZMQ_PUB, options.endpoint, "--kv_events_endpoint", sockets->pub);
      !s.ok()) {
    return s;
  }
  if (!options.replay_endpoint.empty()) {
    if (absl::Status s = bind(ZMQ_ROUTER, options.replay_endpoint, "--kv_events_replay_endpoint",
                              sockets->replay);
        !s.ok()) {
      return s;
    }
  }
  return std::unique_ptr<KvEventPublisher>(
      new KvEventPublisher(std::move(options), std::move(sockets), registry));
}

KvEventPublisher::KvEventPublisher(KvEventPublisherOptions options,
                                   std::unique_ptr<Sockets> sockets, prometheus::Registry& registry)
    : options_(std::move(options)),
      sockets_(std::move(sockets)),
      published_(BatchFamily(registry).Add({{"outcome", "published"}})),
      dropped_(BatchFamily(registry).Add({{"outcome", "dropped"}})),
      replayed_(prometheus::BuildCounter()
                    .Name("tandem_kv_events_replayed_total")
                    .Help("KV event messages sent again on the replay socket")
                    .Register(registry)
                    .Add({})) {
  // Message 0: whatever an earlier run of this daemon published is void.
  std::vector<kvcache::KvEvent> cleared(1);
  cleared[0].kind = kvcache::KvEvent::Kind::kAllCleared;
  Publish(std::move(cleared));
  thread_ = std::thread([this] { Run(); });
}

KvEventPublisher::~KvEventPublisher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  const uint64_t one = 1;
  (void)!write(sockets_->wake, &one, sizeof(one));
  thread_.join();
}

bool KvEventPublisher::Publish(std::vector<kvcache::KvEvent> events) {
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int32_t>(queue_.size()) >= options_.max_queued_batches) {
      dropped_.Increment();
      return false;
    }
    queue_.push_back({absl::Now(), std::move(events)});
  }
  const uint64_t one = 1;
  (void)!write(sockets_->wake, &one, sizeof(one));
  return true;
}

void KvEventPublisher::Run() {
  std::array<zmq_pollitem_t, 2> items{};
  items[0].fd = sockets_->wake;
  items[0].events = ZMQ_POLLIN;
  items[1].socket = sockets_->replay;
  items[1].events = ZMQ_POLLIN;
  const int count = sockets_->replay != nullptr ? 2 : 1;
  for (;;) {
    if (zmq_poll(items.data(), count, -1) < 0 && zmq_errno() != EINTR) {
      spdlog::error("KV events: polling failed ({}); no more events are published",
                    zmq_strerror(zmq_errno()));
      return;
    }
    if (count == 2 && (items[1].revents & ZMQ_POLLIN) != 0) AnswerReplay();
    if ((items[0].revents & ZMQ_POLLIN) == 0) continue;
    uint64_t signals = 0;
    (void)!read(sockets_->wake, &signals, sizeof(signals));
    std::deque<Batch> batches;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      batches.swap(queue_);
      stopping = stopping_;
    }
    for (const Batch& batch : batches) Send(batch);
    if (stopping) return;
  }
}

void KvEventPublisher::Send(const Batch& batch) {
  std::string payload = EncodeKvEventBatch(batch.time, batch.events, options_.block_size);
  const uint64_t sequence = next_sequence_++;
  const std::array<char, 8> seq = BigEndian(sequence);
  // PUB never blocks: past the high-water mark a subscriber misses the
  // message (and can ask the replay socket for it).
  zmq_send(sockets_->pub, options_.topic.data(), options_.topic.size(), ZMQ_SNDMORE);
  zmq_send(sockets_->pub, seq.data(), seq.size(), ZMQ_SNDMORE);
  zmq_send(sockets_->pub, payload.data(), payload.size(), 0);
  published_.Increment();
  if (sockets_->replay == nullptr) return;
  retained_.emplace_back(sequence, std::move(payload));
  while (static_cast<int32_t>(retained_.size()) > options_.replay_messages) retained_.pop_front();
}

void KvEventPublisher::AnswerReplay() {
  for (;;) {
    // One request: its frames up to the last (the envelope: the client's
    // identity, and an empty delimiter from a REQ client), then the
    // sequence number wanted.
    std::vector<std::string> envelope;
    std::optional<uint64_t> from;
    bool more = true;
    bool received = false;
    while (more) {
      zmq_msg_t frame;
      zmq_msg_init(&frame);
      if (zmq_msg_recv(&frame, sockets_->replay, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&frame);
        if (!received) return;  // nothing (more) to answer
        break;
      }
      received = true;
      more = zmq_msg_more(&frame) != 0;
      if (more) {
        envelope.emplace_back(static_cast<const char*>(zmq_msg_data(&frame)), zmq_msg_size(&frame));
      } else {
        from = FromBigEndian(frame);
      }
      zmq_msg_close(&frame);
    }
    if (envelope.empty()) continue;
    auto reply = [&](const std::array<char, 8>& seq, std::string_view payload) {
      for (const std::string& part : envelope) {
        zmq_send(sockets_->replay, part.data(), part.size(), ZMQ_SNDMORE);
      }
      zmq_send(sockets_->replay, seq.data(), seq.size(), ZMQ_SNDMORE);
      zmq_send(sockets_->replay, payload.data(), payload.size(), 0);
    };
    if (from.has_value()) {
      for (const auto& [sequence, payload] : retained_) {
        if (sequence < *from) continue;
        reply(BigEndian(sequence), payload);
        replayed_.Increment();
      }
    }
    reply(BigEndian(~uint64_t{0}), "");  // the end (-1): also the answer to a malformed request
  }
}

}  // namespace tandem::server
