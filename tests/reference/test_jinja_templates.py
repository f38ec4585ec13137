"""Our Jinja interpreter (engine/tokenizer/jinja) against Hugging Face
transformers rendering the same chat templates.

The templates are llama.cpp's collection of real models' chat templates
(models/templates/*.jinja in the llama-cpp-python 0.3.36 source
distribution). Each is rendered on several conversations by
transformers.utils.chat_template_utils.render_jinja_template and by
tandem-jinja-render (TANDEM_JINJA_RENDER) with the same variables, and the two
texts must be byte-identical. A conversation a template rejects under
transformers (raise_exception, an error) is skipped for that template.
"""
import datetime as real_datetime
import functools
import json
import os
import subprocess
import tarfile
import tempfile
import time

import pytest
from transformers.utils import chat_template_utils

import sdist

RENDER = os.environ.get("TANDEM_JINJA_RENDER", "build/bin/tandem-jinja-render")
TEMPLATE_DIR = "vendor/llama.cpp/models/templates/"

# strftime_now() sees this moment in both renderers.
NOW = real_datetime.datetime(2025, 7, 26, 14, 30, 5, 123456)

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                         "description": "Temperature unit"},
            },
            "required": ["location"],
        },
    }},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web and return the top results.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to search for"},
                "max_results": {"type": "integer", "description": "How many", "default": 5},
                "tags": {"type": "array", "items": {"type": "string"},
                         "description": "Only results with these tags"},
            },
            "required": ["query"],
        },
    }},
]

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
USER = {"role": "user", "content": "What is the capital of France?"}
ASSISTANT = {"role": "assistant", "content": "The capital of France is Paris."}
USER2 = {"role": "user", "content": "Écris un poème 🙂 sur \"Paris\" en 2 lignes.\n  Merci !"}
ASSISTANT2 = {"role": "assistant", "content": "Paris s'éveille,\nla Seine sommeille."}
WEATHER_USER = {"role": "user", "content": "What's the weather like in Paris today?"}
TOOL_CALL = {"role": "assistant", "content": "", "tool_calls": [{
    "id": "abc123XYZ", "type": "function",
    "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}]}
# As transformers' message normalization leaves an OpenAI message with
# content None: without the key.
TOOL_CALL_NO_CONTENT = {key: value for key, value in TOOL_CALL.items() if key != "content"}
TOOL_RESULT = {"role": "tool", "tool_call_id": "abc123XYZ", "name": "get_weather",
               "content": "{\"temperature\": 22, \"condition\": \"sunny\"}"}
FINAL = {"role": "assistant", "content": "It is sunny and 22°C in Paris."}
REASONED = {"role": "assistant", "content": "2 + 2 = 4.",
            "reasoning_content": "The user asks for 2 + 2. That is 4."}

# name: (messages, tools, add_generation_prompt)
CONVERSATIONS = {
    "user": ([USER], None, True),
    "user/no-prompt": ([USER], None, False),
    "system+user": ([SYSTEM, USER2], None, True),
    "system+user/no-prompt": ([SYSTEM, USER2], None, False),
    "multi-turn": ([USER, ASSISTANT, USER2], None, True),
    "multi-turn/ends-assistant": ([USER, ASSISTANT, USER2, ASSISTANT2], None, False),
    "system+multi-turn": ([SYSTEM, USER, ASSISTANT, USER2], None, True),
    "tools": ([WEATHER_USER], TOOLS, True),
    "tools+system": ([SYSTEM, WEATHER_USER], TOOLS, True),
    "tool-call": ([WEATHER_USER, TOOL_CALL, TOOL_RESULT], TOOLS, True),
    "tool-call/answered": ([WEATHER_USER, TOOL_CALL, TOOL_RESULT, FINAL], TOOLS, False),
    "tool-call/no-content": ([SYSTEM, WEATHER_USER, TOOL_CALL_NO_CONTENT, TOOL_RESULT], TOOLS,
                             True),
    "tools/no-prompt": ([WEATHER_USER], TOOLS, False),
    "tools+multi-turn": ([USER, ASSISTANT, WEATHER_USER], TOOLS, True),
    "reasoning": ([{"role": "user", "content": "2+2?"}, REASONED, USER], None, True),
    "reasoning/last": ([{"role": "user", "content": "2+2?"}, REASONED], None, False),
}

# Families that must render identically on every conversation they accept,
# and on at least MIN_ACCEPTED of them.
FAMILIES = {
    "Llama 3.1": "meta-llama-Llama-3.1-8B-Instruct",
    "Llama 3.2": "meta-llama-Llama-3.2-3B-Instruct",
    "Llama 3.3": "meta-llama-Llama-3.3-70B-Instruct",
    "Qwen2.5": "Qwen-Qwen2.5-7B-Instruct",
    "Qwen3": "Qwen-Qwen3-0.6B",
    "Qwen3-Coder": "Qwen3-Coder",
    "Mistral Nemo": "mistralai-Mistral-Nemo-Instruct-2407",
    "Devstral": "unsloth-mistral-Devstral-Small-2507",
    "Phi-3.5": "microsoft-Phi-3.5-mini-instruct",
    "Gemma 2": "google-gemma-2-2b-it",
    "Granite 3.3": "ibm-granite-granite-3.3-2B-Instruct",
    "DeepSeek-R1-Distill-Llama": "deepseek-ai-DeepSeek-R1-Distill-Llama-8B",
    "DeepSeek-R1-Distill-Qwen": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
    "SmolLM3": "HuggingFaceTB-SmolLM3-3B",
    "Hermes 3": "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
    "gpt-oss": "openai-gpt-oss-120b",
}
MIN_ACCEPTED = 6

# Variables a template needs beyond transformers' usual ones.
EXTRA_VARIABLES = {
    "fireworks-ai-llama-3-firefunction-v2": {
        "functions": json.dumps([tool["function"] for tool in TOOLS], indent=2),
        "datetime": "26 Jul 2025",
    },
}
MIN_IDENTICAL_FRACTION = 0.9
TEMPLATE_COUNT = 70


def special_tokens(name):
    """bos_token and eos_token as the model's tokenizer would pass them (None:
    the tokenizer has none, and transformers passes no such variable)."""
    if "DeepSeek" in name or "deepseek" in name:
        return "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
    if "Llama-3" in name or "llama-3" in name:
        return "<|begin_of_text|>", "<|eot_id|>"
    if "Qwen" in name or "QwQ" in name or "SmolLM3" in name:
        return None, "<|im_end|>"  # these tokenizers have no bos_token
    if "gemma" in name:
        return "<bos>", "<eos>"
    if "gpt-oss" in name:
        return "<|startoftext|>", "<|return|>"
    if "granite" in name:
        return "<|end_of_text|>", "<|end_of_text|>"
    return "<s>", "</s>"


@functools.lru_cache(maxsize=1)
def templates():
    """{name: source} of every template in the sdist."""
    out = {}
    with tarfile.open(sdist.path()) as tar:
        for member in tar.getmembers():
            if TEMPLATE_DIR in member.name and member.name.endswith(".jinja"):
                name = os.path.basename(member.name)[:-len(".jinja")]
                out[name] = tar.extractfile(member).read().decode("utf-8")
    return out


class _FixedDatetime(real_datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


def reference(source, messages, tools, add_generation_prompt, bos, eos, extra=None):
    """transformers' rendering and the variables it gave the template; the
    exception instead where transformers rejects the conversation."""
    captured = {}
    real_compile = chat_template_utils._compile_jinja_template

    class Recorder:
        def __init__(self, compiled):
            self.compiled = compiled

        def render(self, **kwargs):
            captured.update(kwargs)
            return self.compiled.render(**kwargs)

    chat_template_utils._compile_jinja_template = lambda t: Recorder(real_compile(t))
    chat_template_utils.datetime = _FixedDatetime
    try:
        special = {key: value for key, value in (("bos_token", bos), ("eos_token", eos))
                   if value is not None}
        rendered, _ = chat_template_utils.render_jinja_template(
            conversations=[json.loads(json.dumps(messages))], tools=tools, chat_template=source,
            add_generation_prompt=add_generation_prompt, **special, **(extra or {}))
        return rendered[0], captured, None
    except Exception as e:  # transformers rejects this conversation
        return None, captured, e
    finally:
        chat_template_utils._compile_jinja_template = real_compile
        chat_template_utils.datetime = real_datetime.datetime


def ours(template_file, context):
    now = time.mktime(NOW.timetuple()) + NOW.microsecond / 1e6
    out = subprocess.run([RENDER, template_file, f"--now={now:.6f}"], input=json.dumps(context),
                         capture_output=True, text=True, encoding="utf-8", check=False)
    if out.returncode != 0:
        return None, out.stderr.strip()
    return out.stdout, None


def first_difference(a, b):
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return f"at {i}: transformers {a[max(0, i - 30):i + 40]!r} vs ours {b[max(0, i - 30):i + 40]!r}"


@functools.lru_cache(maxsize=1)
def results():
    """{template: {"accepted": n, "identical": n, "failures": [...], "rejected": n}}."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, source in sorted(templates().items()):
            path = os.path.join(tmp, name + ".jinja")
            with open(path, "w", encoding="utf-8") as f:
                f.write(source)
            bos, eos = special_tokens(name)
            row = {"accepted": 0, "identical": 0, "rejected": 0, "failures": []}
            for conv, (messages, tools, agp) in CONVERSATIONS.items():
                expected, context, error = reference(source, messages, tools, agp, bos, eos,
                                                     EXTRA_VARIABLES.get(name))
                if error is not None:
                    row["rejected"] += 1
                    continue
                row["accepted"] += 1
                text, our_error = ours(path, context)
                if text == expected:
                    row["identical"] += 1
                elif our_error is not None:
                    row["failures"].append(f"{conv}: our error: {our_error}")
                else:
                    row["failures"].append(f"{conv}: {first_difference(expected, text)}")
            out[name] = row
    return out


def summary():
    lines = [f"{'template':58} accepted identical rejected"]
    for name, row in results().items():
        mark = "ok  " if not row["failures"] else "FAIL"
        lines.append(f"{mark} {name:53} {row['accepted']:8} {row['identical']:9} "
                     f"{row['rejected']:8}")
        for failure in row["failures"][:3]:
            lines.append(f"       {failure[:300]}")
    identical = sum(1 for row in results().values() if not row["failures"])
    lines.append(f"{identical} of {len(results())} templates render identically on every "
                 "conversation transformers accepts")
    return "\n".join(lines)


def test_the_sdist_has_all_templates():
    assert len(templates()) == TEMPLATE_COUNT


def test_summary_table():
    print("\n" + summary())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_named_family_renders_identically(family):
    row = results()[FAMILIES[family]]
    assert not row["failures"], "\n".join(row["failures"])
    assert row["accepted"] >= MIN_ACCEPTED, row


def test_most_templates_render_identically():
    rows = results()
    identical = sum(1 for row in rows.values() if not row["failures"])
    assert identical >= MIN_IDENTICAL_FRACTION * TEMPLATE_COUNT, summary()
