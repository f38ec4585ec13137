"""Model families beyond Llama, each on a random-weight file of a small config
of the family (random_models.py): our exact (f32) mode against two
independent evaluations of the same file, a float64 numpy forward pass
(numpy_reference.py) and llama.cpp.

- Greedy: 48 of 48 tokens equal to the float64 pass.
- Logprobs: along that continuation, the float64 pass's top 5 at every
  position within 0.005 of ours.
- The modes that round activations (q16, bf16, q8): >= 95% of greedy choices
  along the float64 continuation agree, every miss a near-tie.
- llama.cpp, which rounds activations to 8 bits, picks our token at every
  position of its own greedy continuation or the two are a near-tie.
- Served: tandemd starts on the file and answers a chat request through the
  OpenAI API (the family's chat template and tokenizer, streamed text).
- Control: the float64 pass without the family's own operation (Qwen2's
  biases, Qwen3's Q/K norms; Phi-3's fused tensors split the other way round;
  Gemma 2's sliding window, Gemma 3's second rotary base; Qwen3-MoE's
  renormalised expert weights, OLMoE's whole-width Q/K norms) is far from ours,
  so getting it wrong would fail the tests above.
"""
import json
import os
import sys
import urllib.request

import numpy as np
import pytest

import numpy_reference
import probe
import random_models

TOKENS = 48
LOGPROB_TOLERANCE = 0.005
NEAR_TIE = 0.5
# qwen3-bf16: Qwen3's file with BF16 matrices (their own packed panels).
ARCHITECTURES = ["qwen2", "qwen3", "phi3", "gemma2", "gemma3", "qwen3moe", "olmoe", "qwen3-bf16"]
# The family's own operation, done wrong (numpy_reference.Session's mistakes).
MISTAKES = {"qwen2": "no_qkv_bias", "qwen3": "no_qk_norm", "phi3": "up_gate_swapped",
            "gemma2": "no_window", "gemma3": "one_rope", "qwen3moe": "no_expert_norm",
            "olmoe": "no_qk_norm", "qwen3-bf16": "no_qk_norm"}
# The modes that round activations against float64: as test_rounding.py.
MIN_AGREEMENT = 0.95
# A router's last chosen expert and the next within this is a choice any
# rounding may swap (these files' router logits spread ~1, neighbours ~0.25
# apart).
ROUTER_NEAR_TIE = 0.02
PROMPT = "The history of the printing press begins in"


@pytest.fixture(scope="module", params=ARCHITECTURES)
def arch_file(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("arch") / f"random-{request.param}.gguf")
    return request.param, random_models.write(path, request.param, seed=7)


@pytest.fixture(scope="module")
def prompt(arch_file):
    """The prompt in the file's own vocabulary, BOS first where it asks for one."""
    _, path = arch_file
    with probe.using_model(path):
        return probe.tokenize([PROMPT], parse_special=False)[0]


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_greedy_tokens_equal_the_float64_pass(arch_file, prompt):
    _, path = arch_file
    reference, _ = numpy_reference.greedy(prompt, TOKENS, path)
    with probe.using_model(path):
        ours = probe.generate([prompt], TOKENS)[0]
    assert ours == reference


def test_top5_logprobs_are_within_tolerance(arch_file, prompt):
    _, path = arch_file
    reference, reference_logits = numpy_reference.greedy(prompt, TOKENS, path)
    with probe.using_model(path):
        ours = probe.logits([prompt + reference[:-1]], f"--positions={TOKENS}")[0]
    ours, theirs = log_softmax(ours.reshape(TOKENS, -1).astype(np.float64)), log_softmax(
        reference_logits)
    worst = 0.0
    for i in range(TOKENS):
        top5 = np.argsort(theirs[i])[-5:]
        worst = max(worst, float(np.abs(ours[i][top5] - theirs[i][top5]).max()))
    print(f"largest top-5 logprob difference: {worst:.2e}")
    assert worst <= LOGPROB_TOLERANCE


@pytest.mark.parametrize("matmul", ["q16", "bf16", "q8"])
def test_the_fast_modes_follow_float64(arch_file, prompt, matmul):
    """The modes that round activations (q16, bf16, q8), teacher-forced
    along the float64 pass's greedy continuation: our choices agree at >= 95%
    of positions and every miss is a near-tie of float64's, either of its
    final logits or, in a mixture of experts, of a router's choice between
    its last expert and the next (rounding swaps those, and the swap moves
    the logits further)."""
    probe.require_matmul(matmul)
    _, path = arch_file
    session = numpy_reference.Session(path)
    reference, reference_logits = numpy_reference.greedy(prompt, TOKENS, session=session)
    with probe.using_model(path):
        ours = probe.logits([prompt + reference[:-1]], f"--positions={TOKENS}",
                            f"--matmul={matmul}")[0].reshape(TOKENS, -1)
    chosen = [int(np.argmax(row)) for row in ours]
    # The position whose logits chose token i: the prompt's last, then each
    # earlier choice's.
    router_margin = session.router_margins[len(prompt) - 1:]
    misses = [(i, round(float(reference_logits[i][reference[i]] -
                              reference_logits[i][chosen[i]]), 3), round(float(router_margin[i]), 4))
              for i in range(TOKENS) if chosen[i] != reference[i]]
    print(f"{matmul}: {TOKENS - len(misses)}/{TOKENS} agree; misses "
          f"(position, float64 gap, smallest router margin): {misses}")
    assert TOKENS - len(misses) >= MIN_AGREEMENT * TOKENS
    assert all(gap <= NEAR_TIE or margin <= ROUTER_NEAR_TIE for _, gap, margin in misses)


def test_llama_cpp_makes_the_same_choices(arch_file, prompt):
    import llama_cpp
    _, path = arch_file
    llm = llama_cpp.Llama(path, n_ctx=256, n_threads=probe.THREADS,
                          n_threads_batch=probe.THREADS, logits_all=True, verbose=False)
    continuation = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        continuation.append(int(token))
        if len(continuation) == TOKENS:
            break
    sequence = prompt + continuation
    llm.reset()
    llm.eval(sequence[:-1])
    n = len(sequence) - 1
    theirs = np.array(llm.scores[n - TOKENS:n], dtype=np.float64)
    with probe.using_model(path):
        ours = probe.logits([sequence[:-1]], f"--positions={TOKENS}")[0].reshape(TOKENS, -1)
    for i in range(TOKENS):
        mine = int(np.argmax(ours[i]))
        if mine == continuation[i]:
            continue
        assert theirs[i][continuation[i]] - theirs[i][mine] <= NEAR_TIE, f"position {i}"
        assert ours[i][mine] - ours[i][continuation[i]] <= NEAR_TIE, f"position {i}"


def test_leaving_out_the_family_operation_is_caught(arch_file, prompt):
    arch, path = arch_file
    wrong = numpy_reference.Session(path, MISTAKES[arch]).forward(prompt)[-1]
    with probe.using_model(path):
        ours = probe.logits([prompt])[0].astype(np.float64)
    assert np.abs(log_softmax(ours) - log_softmax(wrong)).max() > 0.1


def test_tandemd_serves_it(arch_file):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "e2e", "python"))
    import tandem_e2e
    _, path = arch_file
    daemon = tandem_e2e.Daemon(f"--model={path}")
    try:
        daemon.wait_serving()
        base = f"http://127.0.0.1:{daemon.http_port}/v1"
        with urllib.request.urlopen(f"{base}/models", timeout=60) as response:
            model = json.load(response)["data"][0]["id"]
        body = json.dumps({"model": model, "max_tokens": 8, "temperature": 0,
                           "messages": [{"role": "user", "content": "Hello there!"}]}).encode()
        request = urllib.request.Request(
            f"{base}/chat/completions", data=body,
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.load(response)
        assert answer["usage"]["completion_tokens"] == 8
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["choices"][0]["message"]["content"]
    finally:
        daemon.stop()


def test_tandemd_gives_back_sliding_pages_and_keeps_gemmas_answers(arch_file, prompt):
    """Gemma's sliding-window layers (a window of 6 in these files, blocks of
    16 tokens whose part of a pool is one 4 KiB page): tandemd gives back
    those layers' pages of blocks a whole window behind a sequence, and its
    greedy answers (the exact mode, through gRPC) are still the float64
    pass's. Three requests: the prompt; the prompt and most of that answer
    resent (a prefix match over released blocks whose window is whole); a
    prompt sharing only the conversation's first 20 tokens (a match of 16
    would read a released block in its window, so it must be cut). The
    cached prompt tokens each reports are exact."""
    arch, path = arch_file
    if not arch.startswith("gemma"):
        pytest.skip("no sliding-window layers")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "e2e", "python"))
    import grpc
    import tandem_e2e
    pb2, pb2_grpc = tandem_e2e.generated_stubs()
    first, _ = numpy_reference.greedy(prompt, TOKENS, path)
    conversation = prompt + first
    resent = conversation + first[:8]  # the next turn: the conversation and more
    diverging = conversation[:20] + first[:8]
    # The first request leaves len(conversation) - 1 tokens computed; the
    # resend resumes at the last block boundary below that, whose window
    # (keys from there + 1 - 6 on) is whole, so every block wholly below it
    # was given back.
    boundary = (len(conversation) - 1) // 16 * 16
    answers = {tuple(ids): numpy_reference.greedy(ids, 16, path)[0] for ids in (resent, diverging)}
    # --release_sliding_kv=false keeps them all, and the diverging prompt
    # then reuses its first block.
    for release, behind, diverging_cached in ((True, (boundary + 1 - 6) // 16, 0),
                                              (False, 0, 16)):
        daemon = tandem_e2e.Daemon(f"--model={path}", "--cpu_matmul=f32", "--block_size=16",
                                   "--speculative=off", f"--release_sliding_kv={str(release).lower()}")
        try:
            daemon.wait_serving()
            with grpc.insecure_channel(daemon.address) as channel:
                stub = pb2_grpc.GenerationStub(channel)

                def generate(ids, tokens, cached):
                    response = stub.GenerateUnary(pb2.GenerateRequest(
                        token_ids=ids, max_tokens=tokens, ignore_eos=True,
                        sampling=pb2.SamplingParams(temperature=0.0)), timeout=120)
                    assert response.usage.cached_prompt_tokens == cached
                    return list(response.token_ids)

                assert generate(prompt, TOKENS, 0) == first
                name = "tandem_kv_cache_sliding_released_blocks_total "
                assert [float(line[len(name):]) for line in daemon.metrics_text().splitlines()
                        if line.startswith(name)] == [behind]
                assert generate(resent, 16, boundary) == answers[tuple(resent)]
                assert generate(diverging, 16, diverging_cached) == answers[tuple(diverging)]
        finally:
            daemon.stop()
        log = daemon.read_log()
        assert "sliding-window layers" in log, log
        assert ("given back" in log) == release, log
