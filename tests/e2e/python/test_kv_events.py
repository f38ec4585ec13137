"""KV events as a cache-aware router receives them: a subscriber that decodes
the ZeroMQ messages the way llm-d's KV-cache indexer does (three frames,
topic kv@<pod>@<model>, a big-endian sequence number, a msgpack batch of
tagged events) rebuilds the daemon's prefix cache from the events alone,
after a run that evicts, and every block's hash is recomputed here from the
documented SHA-256 chain of its tokens."""
import hashlib
import random
import struct
import threading
import time

import grpc
import msgpack
import pytest
import zmq

import tandem_e2e

pb2, pb2_grpc = tandem_e2e.generated_stubs()

BLOCK = 16
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1"


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


# --- the documented block keys (docs/operations.md, "KV events") -------------

def root_key(salt):
    salt = salt.encode()
    return hashlib.sha256(b"tandem.kv.root" + struct.pack("<Q", len(salt)) + salt).digest()


def chain_key(parent, tokens):
    return hashlib.sha256(parent + struct.pack("<Q", len(tokens)) +
                          struct.pack(f"<{len(tokens)}i", *tokens)).digest()


def published(key):
    """A block key as it goes out: its first 8 bytes, big-endian."""
    return int.from_bytes(key[:8], "big")


def expected_blocks(tokens, salt):
    """{published hash: (parent's published hash or None, block tokens)} for
    every full block of `tokens`."""
    out = {}
    key, parent = root_key(salt), None
    for i in range(len(tokens) // BLOCK):
        block = tokens[i * BLOCK:(i + 1) * BLOCK]
        key = chain_key(key, block)
        out[published(key)] = (parent, block)
        parent = published(key)
    return out


# --- a subscriber, decoding as llm-d's indexer does ------------------------------

class Subscriber:
    def __init__(self, endpoint, replay_endpoint):
        self.context = zmq.Context()
        self.sub = self.context.socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.replay_endpoint = replay_endpoint
        self.live = {}  # sequence -> (topic, payload)
        self.stopping = False
        self.thread = threading.Thread(target=self._receive)
        self.thread.start()

    def _receive(self):
        while not self.stopping:
            if self.sub.poll(100):
                frames = self.sub.recv_multipart()
                assert len(frames) == 3, frames
                topic, seq, payload = frames
                assert len(seq) == 8
                self.live[int.from_bytes(seq, "big")] = (topic.decode(), payload)

    def replay(self, start):
        """Every retained message from `start` on: {sequence: payload}."""
        dealer = self.context.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = {}
        while True:
            assert dealer.poll(10000), "the replay socket did not answer"
            empty, seq, payload = dealer.recv_multipart()
            assert empty == b""
            seq = int.from_bytes(seq, "big", signed=True)
            if seq == -1:
                assert payload == b""
                break
            out[seq] = payload
        dealer.close(linger=0)
        return out

    def close(self):
        self.stopping = True
        self.thread.join()
        self.sub.close(linger=0)
        self.context.term()


def decode_batch(payload):
    """[timestamp, [event...], data_parallel_rank], each event a tagged array."""
    batch = msgpack.unpackb(payload, raw=False)
    assert isinstance(batch, list) and len(batch) == 3, batch
    timestamp, events, rank = batch
    assert isinstance(timestamp, float) and abs(timestamp - time.time()) < 600
    assert rank == 0
    return events


class Index:
    """The set of cached blocks, rebuilt from events alone."""

    def __init__(self):
        self.blocks = {}  # hash -> (parent or None, tokens)
        self.stored = self.removed = self.cleared = 0
        self.ever_stored = set()

    def apply(self, events):
        for event in events:
            tag = event[0]
            if tag == "BlockStored":
                assert len(event) == 7, event
                _, hashes, parent, tokens, block_size, lora_id, medium = event
                assert block_size == BLOCK and lora_id is None and medium is None
                assert len(tokens) == len(hashes) * BLOCK
                for i, h in enumerate(hashes):
                    assert isinstance(h, int) and 0 <= h < 2**64
                    assert h not in self.blocks, "a block stored twice"
                    self.blocks[h] = (parent if i == 0 else hashes[i - 1],
                                      tokens[i * BLOCK:(i + 1) * BLOCK])
                    self.ever_stored.add(h)
                self.stored += len(hashes)
            elif tag == "BlockRemoved":
                assert len(event) == 3 and event[2] is None, event
                for h in event[1]:
                    assert h in self.blocks, "a block removed that was never stored"
                    del self.blocks[h]
                self.removed += len(event[1])
            elif tag == "AllBlocksCleared":
                assert len(event) == 1
                self.blocks.clear()
                self.cleared += 1
            else:
                raise AssertionError(f"unknown event {tag}")


@pytest.fixture(scope="module")
def daemon():
    pub, replay = tandem_e2e.free_port(), tandem_e2e.free_port()
    # A KV cache of 80 blocks (far less than the run below needs: it evicts).
    d = tandem_e2e.Daemon(f"--kv_events_endpoint=tcp://127.0.0.1:{pub}",
                          f"--kv_events_replay_endpoint=tcp://127.0.0.1:{replay}",
                          "--kv_cache_bytes=29491200", "--context_length=512",
                          "--speculative=off")
    d.wait_serving()
    d.pub_endpoint = f"tcp://127.0.0.1:{pub}"
    d.replay_endpoint = f"tcp://127.0.0.1:{replay}"
    yield d
    assert d.stop() == 0
    d.kill()


def test_a_subscriber_rebuilds_the_cache_from_the_events_alone(daemon):
    subscriber = Subscriber(daemon.pub_endpoint, daemon.replay_endpoint)
    try:
        run_and_check(daemon, subscriber)
    finally:
        subscriber.close()


def run_and_check(daemon, subscriber):
    assert f"blocks of {BLOCK} tokens" in daemon.read_log()
    # Three families of prompts sharing a 64-token prefix, some under a
    # tenant's cache salt; greedy, two at a time.
    rng = random.Random(20261204)
    prefixes = [[rng.randrange(300, 30000) for _ in range(64)] for _ in range(3)]
    requests = []
    for i in range(18):
        prompt = prefixes[i % 3] + [rng.randrange(300, 30000) for _ in range(rng.randrange(40, 200))]
        requests.append((prompt, "tenant-a" if i % 4 == 0 else ""))
    answers = [None] * len(requests)

    def run(indices):
        with grpc.insecure_channel(daemon.address) as channel:
            stub = pb2_grpc.GenerationStub(channel)
            for i in indices:
                prompt, salt = requests[i]
                response = stub.GenerateUnary(pb2.GenerateRequest(
                    token_ids=prompt, max_tokens=24, ignore_eos=True, cache_salt=salt,
                    sampling=pb2.SamplingParams(temperature=0.0)), timeout=120)
                answers[i] = list(response.token_ids)

    threads = [threading.Thread(target=run, args=(range(k, len(requests), 2),)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert all(a is not None and len(a) == 24 for a in answers)

    # Every block a request could have cached, keyed as documented.
    expected = {}
    for (prompt, salt), answer in zip(requests, answers):
        expected.update(expected_blocks(prompt + answer, salt))

    # Live messages, and the replay socket for what the subscriber missed
    # (at least message 0, sent before it connected), until the rebuilt
    # index has the daemon's count of cached blocks.
    deadline = time.time() + 30
    messages = {}
    while True:
        messages.update({seq: payload for seq, (_, payload) in list(subscriber.live.items())})
        missing = [s for s in range(max(messages, default=-1) + 1) if s not in messages]
        start = missing[0] if missing else max(messages, default=-1) + 1
        replayed = subscriber.replay(start)
        for seq, payload in replayed.items():
            if seq in messages:
                assert messages[seq] == payload, "a replayed message differs from the live one"
            messages[seq] = payload
        index = Index()
        for seq in sorted(messages):
            index.apply(decode_batch(messages[seq]))
        text = daemon.metrics_text()
        cached = metric(text, "tandem_kv_cache_cached_blocks")
        sent = metric(text, 'tandem_kv_events_batches_total{outcome="published"}')
        if len(index.blocks) == cached and len(messages) == sent or time.time() > deadline:
            break
        time.sleep(0.2)

    assert sorted(messages) == list(range(len(messages))), "sequence numbers have gaps"
    assert decode_batch(messages[0]) == [["AllBlocksCleared"]]
    assert len(subscriber.live) > 0, "nothing arrived on the PUB socket"
    topics = {topic for topic, _ in subscriber.live.values()}
    assert topics == {f"kv@{daemon.address}@{MODEL_NAME}"}
    assert len(messages) == sent
    assert metric(text, 'tandem_kv_events_batches_total{outcome="dropped"}') == 0
    # The run evicted, and the events said so.
    assert metric(text, "tandem_kv_cache_evictions_total") > 0
    assert index.removed > 0 and index.cleared == 1
    # The subscriber's cache is the daemon's: its size, and each block's
    # hash, parent and tokens those of a request's blocks.
    assert len(index.blocks) == cached, (len(index.blocks), cached)
    for h, (parent, tokens) in index.blocks.items():
        assert h in expected, "a published hash that no request's tokens give"
        assert (parent, tokens) == expected[h]
    # Salted blocks are published under their salt's chain (the unsalted
    # chain of the same tokens gives other hashes).
    salted = {h for (p, s), a in zip(requests, answers) if s for h in expected_blocks(p + a, s)}
    unsalted = {h for (p, s), a in zip(requests, answers) for h in expected_blocks(p + a, "")}
    assert index.ever_stored & salted and not salted & unsalted
    print(f"kv events: {len(messages)} messages ({len(subscriber.live)} live), "
          f"{index.stored} blocks stored, {index.removed} removed, {len(index.blocks)} cached "
          f"(daemon: {cached:.0f}, evictions {metric(text, 'tandem_kv_cache_evictions_total'):.0f})")
