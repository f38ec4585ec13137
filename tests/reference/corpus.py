"""Test strings for the tokenizer: prose, code, JSON, numbers, emoji, CJK and
other scripts, whitespace runs, contractions and special-token text. Built
deterministically (fixed seed) so failures reproduce."""
import random

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged that a single man in possession of a good fortune must be in want of a wife.",
    "I'm sure they'll say we've done it, but you'd think he's not.",
    "DON'T SHOUT! I'LL HEAR YOU'RE THERE.",
    "Mr. O'Neil paid $3.50 for 2 coffees at 7:45am on 2024-03-15.",
    "Hello,world!How are you?Fine...thanks!!",
    "e-mail: someone@example.com; web: https://example.org/path?q=1&r=two#frag",
    "Well — that's \"quoted\", isn't it? ‘Single’ and “double” quotes.",
    "Naïve café résumé über façade coöperate jalapeño.",
    "In 1492, Columbus sailed the ocean blue; in 1969, Apollo 11 landed.",
]
CODE = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "#include <iostream>\nint main() {\n\tstd::cout << \"hi\" << std::endl;\n\treturn 0;\n}\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(1, 2)}`);\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello\")\n}\n",
    "SELECT id, name FROM users WHERE age >= 21 AND name LIKE 'A%' ORDER BY id DESC;",
    "<html><body><div class=\"x\">Hello &amp; welcome</div></body></html>",
    "x = [i**2 for i in range(100) if i % 3 == 0]  # squares\n",
    "    indented_with_spaces = True\n\t\ttabs_too = None\n",
    "if (a && b || !c) { x += 1; } else { y -= 2; }",
    "$ grep -rn \"TODO\" src/ | wc -l\n",
    "\\begin{equation} E = mc^2 \\end{equation}",
]
JSON = [
    '{"name": "Alice", "age": 30, "tags": ["a", "b"], "nested": {"x": null, "y": true}}',
    '[1, 2.5, -3e10, "str", {"k": [ ]}]',
    '{\n  "indented": {\n    "deep": [1,2,3]\n  }\n}',
]
NUMBERS = [
    "0", "7", "42", "1234567890", "3.14159265358979", "-0.0001", "1e-5", "6.022e23",
    "0xDEADBEEF", "+1 (555) 123-4567", "192.168.0.1", "1,000,000", "12:34:56", "99%", "½ ¾ ²",
    "٠١٢٣٤٥٦٧٨٩", "१२३", "Ⅻ",
]
EMOJI = [
    "🙂", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "I ❤️ NY", "✨ sparkle ✨", "🤖 robots 🦾",
]
SCRIPTS = [
    "東京は日本の首都です。", "我爱北京天安门", "한국어 텍스트입니다", "Привет, как дела?",
    "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
    "Tiếng Việt có dấu", "ÅÄÖ åäö Øø Ææ", "ﬁ ligature and ＦＵＬＬＷＩＤＴＨ",
]
WHITESPACE = [
    " ", "  ", "   leading", "trailing   ", "a  b   c    d", "\t", "\t\tx", "\n", "\n\n\n",
    "line1\nline2\r\nline3\rline4", " \n \n ", "x \t \n y", "\u00a0non-breaking\u00a0space",
    "\u3000ideographic\u3000space", "end with newline\n", "     \n    code", "a\u2003b",
]
SPECIAL = [
    "<|im_start|>user\nhi<|im_end|>\n", "<|endoftext|>", "text<|endoftext|>more",
    "<|im_start|>", "<|im_st", "<|im_end|><|im_end|>", "< |im_start| >", "<file_sep>path.py",
    "<jupyter_code>print(1)<jupyter_output>1",
]


def random_strings(count, seed=1234):
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n",
        ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
        "éèêëàâäôöûüçñßøåæœ",
        "日本語中文한국어",
        "αβγδεζηθικλμνξοπρστυφχψω",
        "🙂😀👍🏽🎉🚀❤️",
    ]
    out = []
    for _ in range(count):
        n = rng.randint(1, 60)
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(n)))
    return out


def all_strings():
    base = PROSE + CODE + JSON + NUMBERS + EMOJI + SCRIPTS + WHITESPACE + SPECIAL
    combos = [a + b for a, b in zip(PROSE + CODE, SCRIPTS + EMOJI + NUMBERS)]
    long_ones = ["word " * 300, "a" * 500, "1" * 200, " " * 100 + "x", "ab\n" * 200]
    return base + combos + long_ones + random_strings(220)
