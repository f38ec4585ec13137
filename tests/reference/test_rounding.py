"""Our arithmetic modes against a float64 evaluation of the same file
(numpy_reference.py), on chat prompts, 48 greedy tokens each.

`f32` (dequantized weights times float activations) is the exact mode: its
logits stay within 2e-2 of float64 and every greedy choice along the
reference's continuation is the reference's. `bf16` rounds each activation to
bfloat16 before the matrix products (the quants stay exact): the CPU-speed
mode. Its promise, checked here: at least 95% of the greedy choices along
the reference's continuation (teacher forcing) are the reference's, and every
other one is a near-tie in the reference's own logits. `q8` (8-bit
activations, integer products) keeps the same promise with logits that move
further (231/240 on 2026-12-04, every miss within 0.15 of a tie). `q16`
(16-bit activations in two 8-bit digits, integer products) keeps f32's:
every choice the reference's (240/240, centered max 0.030 on 2026-12-07). The deliberately wrong
models below show that the check fails when the model is wrong rather than
rounded.
"""
import numpy as np
import pytest

import numpy_reference
import probe

TOKENS = 48
NEAR_TIE = 0.5
MIN_AGREEMENT = 0.95
# Largest |our logit - float64 logit| after removing the mean difference.
CENTERED_MAX = {"f32": 0.05, "q16": 0.06, "bf16": 0.6, "q8": 1.5}

CONVERSATIONS = [
    [("user", "What is the capital of France?")],
    [("user", "Write a haiku about the sea.")],
    [("user", "Explain what a hash table is in two sentences.")],
    [("system", "You are a helpful coding assistant."),
     ("user", "Write a Python function that checks if a number is prime.")],
    [("user", "Give me three tips for writing clear commit messages.")],
]


@pytest.fixture(scope="module")
def references():
    """(prompt, continuation, float64 logits of each choice) per conversation."""
    out = []
    for _, prompt in probe.chat(CONVERSATIONS):
        continuation, logits = numpy_reference.greedy(prompt, TOKENS)
        out.append((prompt, continuation, logits))
    return out


def compare(references, *flags):
    """(agreeing positions, all positions, disagreements, centered max)."""
    agree, total, disagreements, centered = 0, 0, [], 0.0
    for index, (prompt, continuation, ref) in enumerate(references):
        sequence = prompt + continuation
        ours = probe.logits([sequence[:-1]], f"--positions={TOKENS}", *flags)[0]
        ours = ours.reshape(TOKENS, -1).astype(np.float64)
        d = ours - ref
        centered = max(centered, float(np.abs(d - d.mean(axis=1, keepdims=True)).max()))
        for i in range(TOKENS):
            total += 1
            theirs, mine = continuation[i], int(np.argmax(ours[i]))
            if mine == theirs:
                agree += 1
            else:
                disagreements.append((index, i, round(float(ref[i][theirs] - ref[i][mine]), 3)))
    return agree, total, disagreements, centered


@pytest.mark.parametrize("matmul", ["f32", "q16", "bf16", "q8"])
def test_greedy_choices_match_float64_or_are_near_ties(references, matmul):
    probe.require_matmul(matmul)
    agree, total, disagreements, centered = compare(references, f"--matmul={matmul}")
    print(f"{matmul}: {agree}/{total} greedy choices agree; centered max {centered:.4f}; "
          f"disagreements (prompt, position, float64 gap): {disagreements}")
    assert centered <= CENTERED_MAX[matmul]
    assert agree >= MIN_AGREEMENT * total
    for _, _, gap in disagreements:
        assert gap <= NEAR_TIE
    if matmul in ("f32", "q16"):
        assert not disagreements


def test_the_auto_mode_answers_as_float64():
    """Whatever --cpu_matmul=auto chooses on this CPU answers "What is the
    capital of France?" with float64's greedy tokens (q8, which auto never
    takes, does not)."""
    ((_, prompt),) = probe.chat([[("user", "What is the capital of France?")]])
    reference, _ = numpy_reference.greedy(prompt, 12)
    ours = probe.generate([prompt], 12, "--matmul=auto")[0]
    print(f"auto ({probe.auto_matmul()}): {ours}; float64: {reference}")
    assert ours == reference


@pytest.mark.parametrize("wrong", [
    "--override_rope_base=200000",
    "--override_norm_eps=1e-3",
])
def test_a_wrong_model_fails_the_check(references, wrong):
    mode = probe.auto_matmul()
    agree, total, disagreements, centered = compare(references, f"--matmul={mode}", wrong)
    print(f"{wrong} ({mode}): {agree}/{total} agree; centered max {centered:.4f}")
    failing = (centered > CENTERED_MAX[mode] or agree < MIN_AGREEMENT * total
               or any(gap > NEAR_TIE for _, _, gap in disagreements))
    assert failing
