"""Greedy decoding against llama.cpp: 48 tokens on 5 chat prompts.

llama.cpp rounds activations to 8 bits (see test_logits.py), which moves
logits by up to ~0.9; our f32 evaluation does not. So where two candidate
tokens are nearly tied the two implementations may pick differently. The test
therefore checks every one of the 48 positions along llama.cpp's own
continuation (teacher forcing): our argmax must equal llama.cpp's token, or
the two tokens must be a near-tie in both implementations' logits (a gap of
at most NEAR_TIE, well under the reference's rounding noise). A wrong model
disagrees by several logits (test_logits.py), so it cannot pass as near-ties.
Free-running generation is reported too: it must agree up to its first
divergence, which must also be a near-tie.
"""
import numpy as np
import pytest

import llama_reference
import probe

TOKENS = 48
NEAR_TIE = 0.5

CONVERSATIONS = [
    [("user", "What is the capital of France?")],
    [("user", "Write a haiku about the sea.")],
    [("user", "Explain what a hash table is in two sentences.")],
    [("system", "You are a helpful coding assistant."),
     ("user", "Write a Python function that checks if a number is prime.")],
    [("user", "List three primary colors.")],
]


@pytest.fixture(scope="module")
def prompts():
    return [ids for _, ids in probe.chat(CONVERSATIONS)]


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_every_greedy_choice_matches_or_is_a_near_tie(prompts, index):
    prompt = prompts[index]
    reference = llama_reference.greedy(prompt, TOKENS)
    assert len(reference) == TOKENS
    sequence = prompt + reference
    ref_logits = llama_reference.logits(sequence[:-1], TOKENS)
    ours = probe.logits([sequence[:-1]], f"--positions={TOKENS}")[0].reshape(TOKENS, -1)
    disagreements = []
    for i in range(TOKENS):
        theirs, mine = reference[i], int(np.argmax(ours[i]))
        if mine == theirs:
            continue
        ref_gap = ref_logits[i][theirs] - ref_logits[i][mine]
        our_gap = ours[i][mine] - ours[i][theirs]
        disagreements.append((i, theirs, mine, round(float(ref_gap), 3), round(float(our_gap), 3)))
        assert ref_gap <= NEAR_TIE and our_gap <= NEAR_TIE, (
            f"position {i}: llama.cpp picks {theirs}, we pick {mine}; gaps {ref_gap}, {our_gap}")
    print(f"prompt {index}: {TOKENS - len(disagreements)}/{TOKENS} agree; near-ties: {disagreements}")
    assert len(disagreements) <= TOKENS // 8


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_free_running_generation_agrees_until_a_near_tie(prompts, index):
    prompt = prompts[index]
    reference = llama_reference.greedy(prompt, TOKENS)
    ours = probe.generate([prompt], TOKENS)[0]
    diverge = next((i for i in range(TOKENS) if ours[i] != reference[i]), None)
    print(f"prompt {index}: identical for {TOKENS if diverge is None else diverge} tokens")
    if diverge is None:
        return
    prefix = prompt + reference[:diverge]
    ref_logits = llama_reference.logits(prefix)[0]
    our_logits = probe.logits([prefix])[0]
    assert ref_logits[reference[diverge]] - ref_logits[ours[diverge]] <= NEAR_TIE
    assert our_logits[ours[diverge]] - our_logits[reference[diverge]] <= NEAR_TIE
