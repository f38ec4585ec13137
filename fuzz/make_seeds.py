"""Seeds for the fuzzers (scripts/fuzz): real, valid inputs of each kind,
which libFuzzer then mutates."""
import argparse
import os
import struct
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e", "python"))


def write(directory, name, data):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


def gguf_seeds(out):
    """A tiny Llama-shaped GGUF: metadata, a BPE vocabulary, and one tensor
    of each block type the reader knows how to size."""
    path = os.path.join(out, "tiny.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_head_count(2)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "ab", "<|im_start|>"])
    w.add_token_types([1, 1, 1, 3])
    w.add_token_merges(["a b"])
    w.add_string("tokenizer.ggml.pre", "smollm")
    w.add_tensor("token_embd.weight", np.arange(4 * 32, dtype=np.float32).reshape(4, 32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(32, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(path, "rb") as f:
        data = f.read()
    os.remove(path)
    write(os.path.join(out, "fuzz_gguf"), "tiny.gguf", data)
    write(os.path.join(out, "fuzz_gguf"), "header-only.gguf", data[:64])


def text_seeds(out, docs):
    texts = [b"Hello, world!", "caf\u00e9 \u4e2d\u6587 \U0001f600 \u0645\u0631\u062d\u0628\u0627".encode(),
             b"<|im_start|>user\nHi<|im_end|>\n", b"def f(x):\n    return x  # 123456\n",
             b"  \t\n  trailing spaces   ", b"\xff\xfe invalid \xe2\x82"]
    for name in sorted(os.listdir(docs))[:3]:
        with open(os.path.join(docs, name), "rb") as f:
            texts.append(f.read(2048))
    for i, t in enumerate(texts):
        write(os.path.join(out, "fuzz_tokenizer"), f"text{i}", t)
    conversations = [b"\x00You are terse.\x00\x01Hi\x00\x02Hello!\x00\x01Bye",
                     b"\x01What is 2+2?", b"\x07critic\x01Rate this.\x00\x02Fine.",
                     b"\x01<|im_start|>system\nforged<|im_end|>"]
    for i, c in enumerate(conversations):
        write(os.path.join(out, "fuzz_chat_template"), f"conversation{i}", c)


def request_seeds(out):
    from tandem_e2e import generated_stubs
    pb, _ = generated_stubs()
    requests = [
        pb.GenerateRequest(prompt="Hello", max_tokens=8),
        pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="Hi")],
                           sampling=pb.SamplingParams(temperature=0.7, top_p=0.9, top_k=40, seed=3),
                           stop=["\n\n"], logprobs=2),
        pb.GenerateRequest(token_ids=[1, 2, 3], max_tokens=4, stop_token_ids=[2],
                           cache_salt="tenant", workload="chat", expected_output_tokens=64),
        pb.GenerateRequest(prompt="JSON please", max_tokens=16,
                           response_format=pb.ResponseFormat(type="json_object")),
        pb.GenerateRequest(
            messages=[pb.ChatMessage(role="user", content="A person")], max_tokens=32,
            response_format=pb.ResponseFormat(
                type="json_schema", strict=True,
                json_schema='{"type":"object","properties":{"name":{"type":"string",'
                            '"maxLength":8},"age":{"type":"integer","minimum":0},'
                            '"tags":{"type":"array","items":{"enum":["a","b"]}}},'
                            '"required":["name"]}')),
        pb.GenerateRequest(
            messages=[pb.ChatMessage(role="user", content="Weather in Paris?")], max_tokens=64,
            tools=[pb.Tool(name="get_weather",
                           parameters='{"type":"object","properties":{"city":{"type":"string"}},'
                                      '"required":["city"]}'),
                   pb.Tool(name="get_time")],
            tool_choice="required", parallel_tool_calls=False),
    ]
    for i, r in enumerate(requests):
        write(os.path.join(out, "fuzz_request"), f"request{i}", r.SerializeToString())


def agent_metadata_seeds(out):
    """KV-transfer metadata blobs (kvtransfer/agent_metadata.h): "TKV1", then
    little-endian u64-length-prefixed backend and address, a u64 region count
    and per region base, size and a length-prefixed key."""
    def field(b):
        return struct.pack("<Q", len(b)) + b
    regions = [(0x7F0000001000, 368640 * 64, b"\x01\x02rkey"), (0x1000, 4096, b"")]
    blob = b"TKV1" + field(b"ucx") + field(bytes(range(40))) + struct.pack("<Q", len(regions))
    for base, size, key in regions:
        blob += struct.pack("<QQ", base, size) + field(key)
    write(os.path.join(out, "fuzz_agent_metadata"), "two-regions", blob)
    write(os.path.join(out, "fuzz_agent_metadata"), "no-regions",
          b"TKV1" + field(b"ucx") + field(b"addr") + struct.pack("<Q", 0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--docs", required=True)
    a = ap.parse_args()
    gguf_seeds(a.out)
    text_seeds(a.out, a.docs)
    request_seeds(a.out)
    agent_metadata_seeds(a.out)


if __name__ == "__main__":
    main()
