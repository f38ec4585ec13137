"""Greedy agreement of our arithmetic modes with Hugging Face transformers in
float32 on the same GGUF file (transformers dequantizes it with the gguf
package). For each chat prompt, transformers generates greedily; our engine
(tandem-probe) then scores the same sequence in each mode, and each position
counts as agreeing when our argmax is transformers' token (teacher forcing,
so one divergence does not hide the positions after it). A disagreement is
reported with transformers' own logit gap between the two tokens: a near-tie
when small.

Needs torch and transformers, which the project does not install (they are
large); run it from an environment that has them:

  python bench/compare_hf.py --probe=build/bin/tandem-probe \
      --model=models/SmolLM2-135M-Instruct.Q4_1.gguf [--tokens=64]
"""
import argparse
import os
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))

PROMPTS = [
    [("user", "Why is the sky blue? Answer briefly.")],
    [("user", "Write a limerick about a cat who learns to code.")],
    [("user", "What are the main differences between TCP and UDP?")],
    [("system", "You are a helpful coding assistant."),
     ("user", "Write a C function that returns the length of a string.")],
    [("user", "Summarise the plot of Romeo and Juliet in three sentences.")],
    [("user", "Give me a recipe for pancakes.")],
    [("user", "How do I undo the last git commit but keep my changes?")],
    [("user", "Name five planets of the solar system and one fact about each.")],
    [("system", "You answer in JSON."),
     ("user", "Describe a book with fields title, author and year.")],
    [("user", "What is 17 times 23? Show your working.")],
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--modes", default="f32,bf16,q8")
    ap.add_argument("--near_tie", type=float, default=0.5)
    args = ap.parse_args()
    os.environ["TANDEM_PROBE"] = args.probe
    os.environ["TANDEM_TEST_MODEL"] = args.model
    import probe  # reads the two variables above

    hf = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(args.model)), gguf_file=os.path.basename(args.model),
        torch_dtype=torch.float32)
    hf.eval()
    runs = []
    for _, prompt in probe.chat(PROMPTS):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
                              max_new_tokens=args.tokens, do_sample=False, output_logits=True,
                              return_dict_in_generate=True)
        continuation = out.sequences[0, len(prompt):].tolist()  # up to its end of turn
        scores = torch.stack(out.logits)[:, 0, :].numpy().astype(np.float64)
        runs.append((prompt, continuation, scores))

    print(f"transformers float32 vs tandem, {len(runs)} chat prompts, up to {args.tokens} greedy "
          "tokens each (teacher-forced)")
    print("| mode | positions agreeing | disagreements (transformers' gap) | near-ties only |")
    print("| --- | --- | --- | --- |")
    for mode in args.modes.split(","):
        agree, total, gaps = 0, 0, []
        for prompt, continuation, scores in runs:
            n = len(continuation)
            ours = probe.logits([prompt + continuation[:-1]], f"--positions={n}",
                                f"--matmul={mode}")[0].reshape(n, -1)
            for i in range(n):
                total += 1
                mine = int(np.argmax(ours[i]))
                if mine == continuation[i]:
                    agree += 1
                else:
                    gaps.append(round(float(scores[i][continuation[i]] - scores[i][mine]), 3))
        near = all(g <= args.near_tie for g in gaps)
        print(f"| {mode} | {agree}/{total} ({100.0 * agree / total:.1f}%) | {gaps} | "
              f"{'yes' if near else 'no'} |")


if __name__ == "__main__":
    main()
