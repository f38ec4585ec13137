"""A client that is not ours: Python grpcio with stubs generated from the
proto runs a chat, cancels a stream mid-way, and checks health; every metric
it serves is documented."""
import os
import re

import grpc
import pytest
from grpc_health.v1 import health_pb2

import tandem_e2e

pb2, pb2_grpc = tandem_e2e.generated_stubs()


@pytest.fixture(scope="module")
def daemon():
    d = tandem_e2e.Daemon()
    d.wait_serving()
    yield d
    assert d.stop() == 0
    d.kill()


def test_health_is_serving(daemon):
    assert daemon.health() == health_pb2.HealthCheckResponse.SERVING


def test_chat_streams_an_answer(daemon):
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb2_grpc.GenerationStub(channel)
        request = pb2.GenerateRequest(
            request_id="py-chat",
            messages=[pb2.ChatMessage(role="user", content="What is the capital of France?")],
            sampling=pb2.SamplingParams(temperature=0.0), max_tokens=48)
        messages = list(stub.Generate(request, timeout=120))
    text = "".join(m.text for m in messages)
    assert "Paris" in text
    last = messages[-1]
    assert last.finish_reason == pb2.FINISH_REASON_STOP
    assert last.request_id == "py-chat"
    assert last.usage.completion_tokens == sum(len(m.token_ids) for m in messages)
    assert last.path in (pb2.PATH_COLOCATED, pb2.PATH_DISAGGREGATED)


def test_cancelling_mid_stream(daemon):
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb2_grpc.GenerationStub(channel)
        request = pb2.GenerateRequest(
            messages=[pb2.ChatMessage(role="user", content="Write a very long essay.")],
            sampling=pb2.SamplingParams(temperature=0.0), max_tokens=2000, ignore_eos=True)
        stream = stub.Generate(request, timeout=120)
        received = 0
        for _ in stream:
            received += 1
            if received == 3:
                stream.cancel()
                break
        with pytest.raises(grpc.RpcError) as error:
            next(stream)
        assert error.value.code() == grpc.StatusCode.CANCELLED
        # The daemon keeps serving, and the cancelled request's blocks came back.
        reply = stub.GenerateUnary(pb2.GenerateRequest(prompt="Hello", max_tokens=3), timeout=60)
        assert reply.usage.completion_tokens >= 1
        load = stub.GetLoad(pb2.GetLoadRequest(), timeout=10)
        assert load.kv_used_blocks == 0 and load.accepting


def test_errors_name_the_field(daemon):
    with grpc.insecure_channel(daemon.address) as channel:
        stub = pb2_grpc.GenerationStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.GenerateUnary(pb2.GenerateRequest(prompt="x", max_tokens=-1), timeout=10)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_tokens" in error.value.details()


def test_every_generation_rpc_demands_an_api_key(tmp_path):
    """Walks the service as the proto declares it, so an RPC added later
    without the key check fails here. (gRPC C++ has no hook that can refuse a
    call before its handler on an insecure port: server interceptors cannot
    end a call, and AuthMetadataProcessor needs TLS credentials; so each
    handler checks, and this test checks every handler.)"""
    keys = tmp_path / "keys"
    keys.write_text("k-1\n")
    d = tandem_e2e.Daemon(f"--api_keys_file={keys}")
    try:
        d.wait_serving()  # health answers without a key
        service = pb2.DESCRIPTOR.services_by_name["Generation"]
        assert len(service.methods) >= 5
        with grpc.insecure_channel(d.address) as channel:
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                raw = dict(request_serializer=lambda m: m, response_deserializer=lambda b: b)
                if method.client_streaming:
                    pytest.fail(f"{path}: add a client-streaming case to this test")
                call = (channel.unary_stream(path, **raw) if method.server_streaming
                        else channel.unary_unary(path, **raw))
                for metadata in ((), (("authorization", "Bearer wrong"),)):
                    with pytest.raises(grpc.RpcError) as error:
                        result = call(b"", metadata=metadata, timeout=30)
                        if method.server_streaming:
                            list(result)
                    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED, path
            # With the key, the cheapest call goes through.
            stub = pb2_grpc.GenerationStub(channel)
            info = stub.GetModelInfo(pb2.GetModelInfoRequest(), timeout=30,
                                     metadata=(("authorization", "Bearer k-1"),))
            assert info.context_length > 0
        assert d.stop() == 0
    finally:
        d.kill()


def test_every_metric_served_is_documented(daemon):
    """docs/metrics.md lists every metric family /metrics serves (a new
    metric without its row fails here)."""
    served = daemon.metric_families()
    assert "tandem_requests_total" in served and "tandem_open_calls" in served
    docs = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "metrics.md")
    with open(docs) as f:
        documented = set(re.findall(r"^\| `(tandem_[a-z0-9_]+)`", f.read(), flags=re.M))
    missing = sorted(name for name in served if name.startswith("tandem_") and name not in documented)
    assert not missing, f"served but not in docs/metrics.md: {missing}"
