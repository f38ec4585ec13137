// The Jinja interpreter (engine/tokenizer/jinja) construct by construct. Every
// expected string is what Python's jinja2 3.1.6 prints under transformers'
// chat-template environment (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, loopcontrols, {% generation %}, its tojson, raise_exception
// and strftime_now), computed with Python, not with our interpreter. Whole
// real chat templates are compared with transformers in
// tests/reference/test_jinja_templates.py.
#include "engine/tokenizer/jinja/jinja.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/time/civil_time.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace tandem::jinja {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// What strftime_now() sees: 2025-07-26 14:30:05 local time.
RenderOptions FixedNow() {
  RenderOptions options;
  options.now = absl::FromCivil(absl::CivilSecond(2025, 7, 26, 14, 30, 5), absl::LocalTimeZone());
  return options;
}

// The rendered text, or "ERROR: <status>" (so that a failure shows why).
std::string Render(std::string_view source, std::string_view context_json = "{}") {
  auto tmpl = Template::Parse(source);
  if (!tmpl.ok()) return "ERROR: " + tmpl.status().ToString();
  auto text = tmpl->Render(nlohmann::ordered_json::parse(context_json), FixedNow());
  if (!text.ok()) return "ERROR: " + text.status().ToString();
  return *text;
}

void ExpectParseError(std::string_view source, std::string_view message) {
  auto tmpl = Template::Parse(source);
  ASSERT_FALSE(tmpl.ok()) << source;
  EXPECT_EQ(tmpl.status().code(), absl::StatusCode::kInvalidArgument) << source;
  EXPECT_THAT(std::string(tmpl.status().message()), HasSubstr(std::string(message))) << source;
}

absl::Status RenderStatus(std::string_view source, std::string_view context_json = "{}") {
  auto tmpl = Template::Parse(source);
  if (!tmpl.ok()) return tmpl.status();
  return tmpl->Render(nlohmann::ordered_json::parse(context_json)).status();
}

void ExpectRenderError(std::string_view source, std::string_view context_json,
                       std::string_view message) {
  auto tmpl = Template::Parse(source);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  auto text = tmpl->Render(nlohmann::ordered_json::parse(context_json));
  ASSERT_FALSE(text.ok()) << source << " rendered " << *text;
  EXPECT_THAT(std::string(text.status().message()), HasSubstr(std::string(message))) << source;
}

TEST(JinjaTest, TextAndDelimiters) {
  EXPECT_EQ(Render(R"J(Hello, world!)J", R"J({})J"), "Hello, world!");
  EXPECT_EQ(Render(R"J(a{{ 1 }}b{% if true %}c{% endif %}d{# comment #}e)J", R"J({})J"), "a1bcde");
  EXPECT_EQ(Render(R"J({{ 'x' }}{# a {{ comment }} with {% tags %} #}{{ 'y' }})J", R"J({})J"),
            "xy");
  EXPECT_EQ(Render("line\n", R"J({})J"), "line");
  EXPECT_EQ(Render("line\n\n", R"J({})J"), "line\n");
  EXPECT_EQ(Render("a\r\nb\rc", R"J({})J"), "a\nb\nc");
  EXPECT_EQ(Render(R"J({% raw %}{{ not evaluated }}{% endraw %})J", R"J({})J"),
            "{{ not evaluated }}");
  EXPECT_EQ(Render(R"J({{ '}}' }}{{ {'a': {'b': 1}} }})J", R"J({})J"), "}}{'a': {'b': 1}}");
}

TEST(JinjaTest, WhitespaceControl) {
  EXPECT_EQ(Render(R"J(a  {{- 'b' -}}  c)J", R"J({})J"), "abc");
  EXPECT_EQ(Render("a\n  {%- if true -%}\n  b\n  {%- endif -%}\n  c", R"J({})J"), "abc");
  EXPECT_EQ(Render("<\n  {% if true %}\n  x\n  {% endif %}\n>", R"J({})J"), "<\n  x\n>");
  EXPECT_EQ(Render(R"J(  {% if true %}x{% endif %}  y)J", R"J({})J"), "x  y");
  EXPECT_EQ(Render(R"J(a  {% if true %}x{% endif %})J", R"J({})J"), "a  x");
  EXPECT_EQ(Render("<\n  {{ 'v' }}\n>", R"J({})J"), "<\n  v\n>");
  EXPECT_EQ(Render("<\n  {%+ if true %}x{% endif +%}\ny>", R"J({})J"), "<\n  x\ny>");
  EXPECT_EQ(Render("a\n  {# c #}\nb", R"J({})J"), "a\nb");
  EXPECT_EQ(Render(R"J(a  {#- c -#}  b)J", R"J({})J"), "ab");
  EXPECT_EQ(Render("{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n", R"J({})J"), "  1\n  2\n");
  EXPECT_EQ(
      Render(
          "{%- for m in messages -%}\n    <{{ m.role }}>\n{%- endfor %}",
          R"J({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]})J"),
      "<system><user><assistant><user>");
}

TEST(JinjaTest, IfElifElse) {
  EXPECT_EQ(Render(R"J({% if x > 1 %}big{% elif x == 1 %}one{% else %}small{% endif %})J",
                   R"J({"x": 1})J"),
            "one");
  EXPECT_EQ(Render(R"J({% if x > 1 %}big{% elif x == 1 %}one{% else %}small{% endif %})J",
                   R"J({"x": 5})J"),
            "big");
  EXPECT_EQ(Render(R"J({% if x > 1 %}big{% elif x == 1 %}one{% else %}small{% endif %})J",
                   R"J({"x": 0})J"),
            "small");
  EXPECT_EQ(
      Render(
          R"J({% if [] %}a{% elif {} %}b{% elif '' %}c{% elif 0.0 %}d{% elif none %}e{% else %}f{% endif %})J",
          R"J({})J"),
      "f");
  EXPECT_EQ(Render(R"J({% if missing %}yes{% else %}no{% endif %})J", R"J({})J"), "no");
  EXPECT_EQ(Render(R"J({% if true %}{% set y = 1 %}{% endif %}{{ y }})J", R"J({})J"), "1");
}

TEST(JinjaTest, ForLoops) {
  EXPECT_EQ(
      Render(
          R"J({% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %})J",
          R"J({"items": ["a", "b", "c"]})J"),
      "10TrueFalse332;21FalseFalse321;32FalseTrue310;");
  EXPECT_EQ(
      Render(
          R"J({% for x in items %}[{{ loop.previtem }}|{{ x }}|{{ loop.nextitem }}]{% endfor %})J",
          R"J({"items": [1, 2, 3]})J"),
      "[|1|2][1|2|3][2|3|]");
  EXPECT_EQ(Render(R"J({% for x in items %}{{ loop.cycle('odd', 'even') }}{% endfor %})J",
                   R"J({"items": [1, 2, 3]})J"),
            "oddevenodd");
  EXPECT_EQ(
      Render(
          R"J({% for x in [1, 1, 2, 3, 3] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %})J",
          R"J({})J"),
      "123");
  EXPECT_EQ(
      Render(
          R"J({% for x in items if x is odd %}{{ loop.index }}:{{ x }}/{{ loop.length }} {% endfor %})J",
          R"J({"items": [1, 2, 3, 4, 5]})J"),
      "1:1/3 2:3/3 3:5/3 ");
  EXPECT_EQ(
      Render(
          R"J({% for x in [] %}a{% else %}empty{% endfor %}|{% for x in [0] if x %}a{% else %}filtered{% endfor %})J",
          R"J({})J"),
      "empty|filtered");
  EXPECT_EQ(Render(R"J({% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %})J",
                   R"J({"d": {"b": 1, "a": 2}})J"),
            "b=1,a=2,");
  EXPECT_EQ(Render(R"J({% for a, (b, c) in [(1, (2, 3))] %}{{ a }}{{ b }}{{ c }}{% endfor %})J",
                   R"J({})J"),
            "123");
  EXPECT_EQ(
      Render(
          R"J({% for k in d %}{{ k }}{% endfor %}{% for ch in 'héllo' %}[{{ ch }}]{% endfor %})J",
          R"J({"d": {"x": 1, "y": 2}})J"),
      "xy[h][é][l][l][o]");
  EXPECT_EQ(
      Render(
          R"J({% for i in range(10) %}{% if i is even %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %})J",
          R"J({})J"),
      "135");
  EXPECT_EQ(
      Render(
          R"J({% for row in [[1, 2], [3]] %}{% for x in row %}{{ loop.index }}.{{ x }} {% endfor %}/{{ loop.index }} {% endfor %})J",
          R"J({})J"),
      "1.1 2.2 /1 1.3 /2 ");
  EXPECT_EQ(
      Render(R"J({% for i in [1, 2] %}{% set inner = i %}{% endfor %}[{{ inner }}])J", R"J({})J"),
      "[]");
  EXPECT_EQ(
      Render(
          R"J({% set y = 0 %}{% for i in [1, 2] %}{{ y }}{% set y = i %}{{ y }}{% endfor %}{{ y }})J",
          R"J({})J"),
      "01020");
  EXPECT_EQ(Render(R"J({% for x in undefined_thing %}a{% else %}none{% endfor %})J", R"J({})J"),
            "none");
  EXPECT_EQ(
      Render(
          R"J({% for node in tree recursive %}{{ node.name }}{% if node.children %}({{ loop(node.children) }}){% endif %}{{ loop.depth }}{% endfor %})J",
          R"J({"tree": [{"name": "a", "children": [{"name": "b", "children": []}, {"name": "c"}]}, {"name": "d"}]})J"),
      "a(b2c2)1d1");
}

TEST(JinjaTest, SetAndNamespaces) {
  EXPECT_EQ(
      Render(
          R"J({% set x = 1 %}{% set a, b = 'xy' %}{% set t = 1, 2 %}{{ x }}{{ a }}{{ b }}{{ t }})J",
          R"J({})J"),
      "1xy(1, 2)");
  EXPECT_EQ(
      Render(
          R"J({% set ns = namespace(count=0, found=false) %}{% for i in [1, 2, 3] %}{% set ns.count = ns.count + i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }})J",
          R"J({})J"),
      "6 True");
  EXPECT_EQ(
      Render(
          R"J({% set ns = namespace(items=[]) %}{% for i in [1, 2] %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.items }} {{ ns['items'] }})J",
          R"J({})J"),
      "[1, 2] [1, 2]");
  EXPECT_EQ(
      Render(
          R"J({% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }})J",
          R"J({})J"),
      "12False");
  EXPECT_EQ(Render(R"J({% set body %}Hello {{ name }}!{% endset %}[{{ body }}])J",
                   R"J({"name": "Ann"})J"),
            "[Hello Ann!]");
  EXPECT_EQ(
      Render(R"J({% set body | upper | trim %}  shout  {% endset %}[{{ body }}])J", R"J({})J"),
      "[SHOUT]");
  EXPECT_EQ(
      Render(
          R"J({% set messages = messages[1:] %}{{ messages | length }})J",
          R"J({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]})J"),
      "3");
}

TEST(JinjaTest, Macros) {
  EXPECT_EQ(
      Render(
          R"J({% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', 'Hi') }} {{ greet(greeting='Yo', name='Cy') }})J",
          R"J({})J"),
      "Hello, Ann! Hi, Bob! Yo, Cy!");
  EXPECT_EQ(
      Render(
          R"J({% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }})J",
          R"J({})J"),
      "1|(2, 3)|{'x': 4}");
  EXPECT_EQ(Render(R"J({% macro m(a, b) %}[{{ a }}][{{ b }}]{% endmacro %}{{ m(1) }})J", R"J({})J"),
            "[1][]");
  EXPECT_EQ(
      Render(
          R"J({% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1) | int }}{% endif %}{% endmacro %}{{ fact(5) }})J",
          R"J({})J"),
      "120");
  EXPECT_EQ(
      Render(
          R"J({% set x = 1 %}{% macro show() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ show() }})J",
          R"J({})J"),
      "2");
  EXPECT_EQ(
      Render(
          R"J({% macro render(t) %}{% if t is mapping %}{ {%- for k, v in t.items() %}{{ k }}: {{ render(v) }}{{ ', ' if not loop.last }}{% endfor -%} }{% else %}{{ t }}{% endif %}{% endmacro %}{{ render({'a': {'b': 1, 'c': 2}}) }})J",
          R"J({})J"),
      "{a: {b: 1, c: 2}}");
  EXPECT_EQ(
      Render(
          R"J({% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 + 1 }}{% endcall %})J",
          R"J({})J"),
      "<b>bold 2</b>");
  EXPECT_EQ(
      Render(
          R"J({% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}<{{ x }}>{% endcall %})J",
          R"J({})J"),
      "<1><2>");
  EXPECT_EQ(
      Render(R"J({% macro m() %}x{% endmacro %}{{ m is callable }}{{ m() ~ m() }})J", R"J({})J"),
      "Truexx");
}

TEST(JinjaTest, FilterGenerationAndWithBlocks) {
  EXPECT_EQ(
      Render(R"J({% filter upper %}hello {{ name }}{% endfilter %})J", R"J({"name": "ann"})J"),
      "HELLO ANN");
  EXPECT_EQ(
      Render(R"J({% filter replace('a', 'o') | trim %}  banana  {% endfilter %})J", R"J({})J"),
      "bonono");
  EXPECT_EQ(
      Render(
          R"J({% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% endif %}{% endfor %})J",
          R"J({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]})J"),
      "Hello.");
  EXPECT_EQ(Render(R"J({% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}])J", R"J({})J"),
            "3[]");
}

TEST(JinjaTest, Literals) {
  EXPECT_EQ(
      Render(
          R"J({{ 'single' }} {{ "double" }} {{ 'it\'s' }} {{ "a\tb\\c\nd" }} {{ '\u00e9\x41\101' }} {{ 'a' 'b' }})J",
          R"J({})J"),
      "single double it's a\tb\\c\nd éAA ab");
  EXPECT_EQ(
      Render(
          R"J({{ 42 }} {{ -7 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 3.14 }} {{ 1e3 }} {{ 2.5E-3 }} {{ 1.0 }})J",
          R"J({})J"),
      "42 -7 1000 31 15 5 3.14 1000.0 0.0025 1.0");
  EXPECT_EQ(
      Render(R"J({{ true }} {{ True }} {{ false }} {{ False }} {{ none }} {{ None }})J", R"J({})J"),
      "True True False False None None");
  EXPECT_EQ(
      Render(
          R"J({{ [1, 'a', none, true, 1.5] }} {{ (1,) }} {{ (1, 2) }} {{ () }} {{ {'a': 1, 'b': [2]} }} {{ {} }} {{ [] }})J",
          R"J({})J"),
      "[1, 'a', None, True, 1.5] (1,) (1, 2) () {'a': 1, 'b': [2]} {} []");
  EXPECT_EQ(Render(R"J({{ [1, 2,] }} {{ {'k': 'v',} }})J", R"J({})J"), "[1, 2] {'k': 'v'}");
}

TEST(JinjaTest, Printing) {
  EXPECT_EQ(
      Render(
          R"J({{ x }}|{{ y }}|{{ z }}|{{ f }}|{{ g }}|{{ h }}|{{ i }})J",
          R"J({"x": null, "y": true, "z": 0.1, "f": 1e+16, "g": 1e-05, "h": 123456789012, "i": -0.0})J"),
      "None|True|0.1|1e+16|1e-05|123456789012|-0.0");
  EXPECT_EQ(
      Render(
          R"J({{ d }})J",
          R"J({"d": {"name": "x", "list": ["it's", "say \"hi\"", "both ' and \"", "tab\there", "é", " "], "n": null, "t": false}})J"),
      "{'name': 'x', 'list': [\"it's\", 'say \"hi\"', 'both \\' and \"', 'tab\\there', 'é', "
      "'\\xa0'], 'n': None, 't': False}");
  EXPECT_EQ(Render(R"J({{ missing }}|{{ [missing] }}|{{ 1 / 3 }}|{{ 2 ** 0.5 }}|{{ 10 / 2 }})J",
                   R"J({})J"),
            "|[Undefined]|0.3333333333333333|1.4142135623730951|5.0");
}

TEST(JinjaTest, AttributesAndSubscripts) {
  EXPECT_EQ(
      Render(
          R"J({{ m.role }} {{ m['role'] }} {{ m.missing is defined }} {{ m['missing'] is defined }})J",
          R"J({"m": {"role": "user"}})J"),
      "user user False False");
  EXPECT_EQ(Render(R"J({{ d.items is callable }}|{{ d['items'] }}|{{ d.get('items') }})J",
                   R"J({"d": {"items": "key"}})J"),
            "True|key|key");
  EXPECT_EQ(
      Render(
          R"J({{ l[0] }} {{ l[-1] }} {{ l.1 }} {{ l[10] is defined }} {{ 'abc'[1] }} {{ 'héllo'[1] }})J",
          R"J({"l": [1, 2, 3]})J"),
      "1 3 2 False b é");
  EXPECT_EQ(
      Render(
          R"J({{ l[1:] }} {{ l[:-1] }} {{ l[::2] }} {{ l[::-1] }} {{ l[-2:] }} {{ l[5:] }} {{ l[1:3] }})J",
          R"J({"l": [1, 2, 3, 4]})J"),
      "[2, 3, 4] [1, 2, 3] [1, 3] [4, 3, 2, 1] [3, 4] [] [2, 3]");
  EXPECT_EQ(
      Render(
          R"J({{ 'hello'[1:4] }} {{ 'hello'[::-1] }} {{ 'héllo wörld'[-5:] }} {{ 'abc'[-10:10] }})J",
          R"J({})J"),
      "ell olleh wörld abc");
  EXPECT_EQ(
      Render(R"J({{ none.attr is defined }} {{ (5).attr is defined }} {{ {}['x'] is defined }})J",
             R"J({})J"),
      "False False False");
}

TEST(JinjaTest, Arithmetic) {
  EXPECT_EQ(
      Render(
          R"J({{ 1 + 2 }} {{ 5 - 7 }} {{ 3 * 4 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }})J",
          R"J({})J"),
      "3 -2 12 3.5 2.0 3 -4 1 2 1024 0.5");
  EXPECT_EQ(
      Render(
          R"J({{ 1.5 + 1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 0.1 + 0.2 }} {{ true + 1 }} {{ 2 ** 3 ** 2 }})J",
          R"J({})J"),
      "2.5 3.0 0.5 0.30000000000000004 2 64");
  EXPECT_EQ(
      Render(
          R"J({{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ [0] * 3 }} {{ 'x' ~ 1 ~ none ~ [1] ~ missing }})J",
          R"J({})J"),
      "ab ababab [1, 2] [0, 0, 0] x1None[1]");
  EXPECT_EQ(
      Render(
          R"J({{ -x }} {{ +x }} {{ -(1 + 2) * 3 }} {{ -2 | abs }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }})J",
          R"J({"x": 5})J"),
      "-5 5 -9 2 7 9");
  EXPECT_EQ(
      Render(
          R"J({{ '%s is %d years' % ('Ann', 30) }} {{ '%.2f|%5s|%-5s|%03d' % (3.14159, 'ab', 'cd', 7) }} {{ '%(a)s' % {'a': 1} }} {{ '100%%' % () }})J",
          R"J({})J"),
      "Ann is 30 years 3.14|   ab|cd   |007 1 100%");
}

TEST(JinjaTest, ComparisonsAndLogic) {
  EXPECT_EQ(
      Render(
          R"J({{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 2 >= 2 }} {{ 1 <= 0 }})J",
          R"J({})J"),
      "True True True True True False True False");
  EXPECT_EQ(
      Render(
          R"J({{ 1 in [1, 2] }} {{ 'a' in 'cat' }} {{ 'k' in {'k': 1} }} {{ 3 not in [1, 2] }} {{ 'x' not in 'xyz' }})J",
          R"J({})J"),
      "True True True True False");
  EXPECT_EQ(
      Render(
          R"J({{ true and 'yes' }} {{ 0 or 'default' }} {{ not none }} {{ not 1 }} {{ none or [] }} {{ 'a' and 0 }})J",
          R"J({})J"),
      "yes default True False [] 0");
  EXPECT_EQ(
      Render(
          R"J({{ 'a' if x else 'b' }} {{ 'a' if not x else 'b' }} [{{ 'only' if x }}] [{{ 'only' if not x }}])J",
          R"J({"x": true})J"),
      "a b [only] []");
  EXPECT_EQ(
      Render(
          R"J({{ missing == missing }} {{ none == none }} {{ missing == none }} {{ [1, 2] == [1, 2] }} {{ (1, 2) == [1, 2] }} {{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }})J",
          R"J({})J"),
      "True True False True False True");
}

TEST(JinjaTest, Tests) {
  EXPECT_EQ(
      Render(
          R"J({{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ n is none }} {{ x is not none }})J",
          R"J({"x": 1, "n": null})J"),
      "True False True True True");
  EXPECT_EQ(
      Render(
          R"J({{ 's' is string }} {{ 1 is string }} {{ 1 is number }} {{ 1.5 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ 1 is float }})J",
          R"J({})J"),
      "True False True True True True False True False");
  EXPECT_EQ(
      Render(
          R"J({{ {} is mapping }} {{ [] is mapping }} {{ [] is iterable }} {{ 's' is iterable }} {{ 1 is iterable }} {{ missing is iterable }} {{ [] is sequence }} {{ 's' is sequence }} {{ {} is sequence }} {{ 1 is sequence }})J",
          R"J({})J"),
      "True False True True False True True True True False");
  EXPECT_EQ(
      Render(
          R"J({{ true is boolean }} {{ 1 is boolean }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }})J",
          R"J({})J"),
      "True False True False True False");
  EXPECT_EQ(
      Render(
          R"J({{ 1 is equalto 1 }} {{ 1 is eq 2 }} {{ 1 is ne 2 }} {{ 3 is odd }} {{ 3 is even }} {{ -3 is odd }} {{ 9 is divisibleby 3 }} {{ 10 is divisibleby(3) }})J",
          R"J({})J"),
      "True False True True False True True False");
  EXPECT_EQ(
      Render(
          R"J({{ 2 is in [1, 2] }} {{ 'abc' is lower }} {{ 'aBc' is lower }} {{ 'ABC' is upper }} {{ range is callable }} {{ 1 is callable }} {{ 3 is gt 2 }} {{ 3 is lt 2 }} {{ 2 is ge 2 }} {{ 2 is le 1 }})J",
          R"J({})J"),
      "True True False True True False True False True False");
  EXPECT_EQ(
      Render(
          R"J({{ none is sameas none }} {{ [] is sameas [] }} {{ 'upper' is filter }} {{ 'nope' is filter }} {{ 'odd' is test }})J",
          R"J({})J"),
      "True False True False True");
  EXPECT_EQ(
      Render(
          R"J({{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('even') | list }} {{ [1, 2, 3] | select('gt', 1) | list }} {{ [1, 2, 3] | select('==', 2) | list }} {{ [0, 1, '', 'a'] | select | list }})J",
          R"J({})J"),
      "[1, 3] [1, 3] [2, 3] [2] [1, 'a']");
}

TEST(JinjaTest, StringFilters) {
  EXPECT_EQ(
      Render(
          R"J([{{ '  a b  ' | trim }}] [{{ 'xxaxx' | trim('x') }}] {{ 'Hello' | upper }} {{ 'Hello' | lower }} {{ 'hello WORLD' | capitalize }} {{ 'hello big-world (x) o\'neil' | title }})J",
          R"J({})J"),
      "[a b] [a] HELLO hello Hello world Hello Big-World (X) O'neil");
  EXPECT_EQ(
      Render(
          R"J({{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 42 | string }} {{ none | string }} {{ [1] | string }} {{ 'x' | safe }} {{ '<a href="x">&\'' | escape }} {{ '<b>' | e }})J",
          R"J({})J"),
      "a+b+c bba 42 None [1] x &lt;a href=&#34;x&#34;&gt;&amp;&#39; &lt;b&gt;");
  EXPECT_EQ(
      Render(
          R"J({{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(2, blank=true) }}|{{ 'a\nb' | indent('> ') }})J",
          R"J({})J"),
      "a\n    b\n\n    c|  a\n  b|a\n  \n  b|a\n> b");
  EXPECT_EQ(
      Render(
          R"J([{{ 'x' | center(7) }}] {{ 'one two three four five' | truncate(12) }} {{ 'one two three' | truncate(9, true) }} {{ 'short' | truncate(10) }} {{ 'hello world foo bar' | wordcount }})J",
          R"J({})J"),
      "[   x   ] one two... one two three short 4");
  EXPECT_EQ(
      Render(
          R"J({{ '%s-%s' | format('a', 'b') }} {{ '%(x)s!' | format(x=1) }} {{ 'abc' | length }} {{ 'héllo' | count }} {{ 'héllo' | reverse }} {{ 'héllo' | first }} {{ 'héllo' | last }} {{ 'héllo' | list }})J",
          R"J({})J"),
      "a-b 1! 3 5 olléh h o ['h', 'é', 'l', 'l', 'o']");
}

TEST(JinjaTest, NumberFilters) {
  EXPECT_EQ(
      Render(
          R"J({{ '42' | int }} {{ '4.7' | int }} {{ 4.7 | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ '0x1A' | int(0, 16) }} {{ ' 12 ' | int }} {{ true | int }})J",
          R"J({})J"),
      "42 4 4 0 7 26 12 1");
  EXPECT_EQ(
      Render(
          R"J({{ '3.5' | float }} {{ 3 | float }} {{ 'x' | float }} {{ -3 | abs }} {{ -2.5 | abs }})J",
          R"J({})J"),
      "3.5 3.0 0.0 3 2.5");
  EXPECT_EQ(
      Render(
          R"J({{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 1.234 | round(1, 'ceil') }} {{ 1.26 | round(1, 'floor') }} {{ 7 | round }} {{ 1234 | round(-2) }})J",
          R"J({})J"),
      "2.0 4.0 2.67 1.3 1.2 7 1200");
  EXPECT_EQ(
      Render(
          R"J({{ [1, 2, 3] | sum }} {{ [1.5, 2] | sum }} {{ items | sum(attribute='n') }} {{ [[1], [2]] | sum(start=[]) }} {{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ items | max(attribute='n') }} {{ ['b', 'A', 'c'] | min }} {{ ['b', 'A', 'c'] | max(case_sensitive=true) }})J",
          R"J({"items": [{"n": 1}, {"n": 5}, {"n": 2}]})J"),
      "6 3.5 8 [1, 2] 1 3 {'n': 5} A c");
}

TEST(JinjaTest, SequenceFilters) {
  EXPECT_EQ(
      Render(
          R"J({{ [1, 2] | length }} {{ {'a': 1} | count }} {{ [3, 4] | first }} {{ [3, 4] | last }} {{ [] | first is defined }} {{ 'abc' | list }} {{ {'a': 1, 'b': 2} | list }})J",
          R"J({})J"),
      "2 1 3 4 False ['a', 'b', 'c'] ['a', 'b']");
  EXPECT_EQ(
      Render(
          R"J({{ ['a', 'b'] | join }} {{ ['a', 'b'] | join(', ') }} {{ [1, 2] | join('-') }} {{ users | join(', ', attribute='name') }})J",
          R"J({"users": [{"name": "x"}, {"name": "y"}]})J"),
      "ab a, b 1-2 x, y");
  EXPECT_EQ(
      Render(
          R"J({{ missing | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ none | d('x', boolean=true) }} {{ 0 | default(5) }} {{ missing | default }})J",
          R"J({})J"),
      "d  d x 0 ");
  EXPECT_EQ(
      Render(
          R"J({{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }} {{ users | sort(attribute='age') | map(attribute='name') | join }} {{ users | sort(attribute='age,name') | map(attribute='name') | join }})J",
          R"J({"users": [{"name": "c", "age": 3}, {"name": "a", "age": 1}, {"name": "b", "age": 1}]})J"),
      "[1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] ['A', 'b', 'c'] abc abc");
  EXPECT_EQ(
      Render(
          R"J({{ [1, 2, 1, 3] | unique | list }} {{ ['a', 'A', 'b'] | unique | list }} {{ [1, 2, 3] | reverse | list }} {{ (1, 2) | reverse | join }} {{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ [1, 2, 3] | batch(2, 0) | list }} {{ [1, 2, 3, 4, 5] | slice(2) | list }})J",
          R"J({})J"),
      "[1, 2, 3] ['a', 'b'] [3, 2, 1] 21 [[1, 2], [3, 4], [5]] [[1, 2], [3, 0]] [[1, 2, 3], [4, "
      "5]]");
  EXPECT_EQ(
      Render(
          R"J({{ d | dictsort }} {{ d | dictsort(reverse=true) }} {{ d | dictsort(by='value') }} {{ d | items | list }} {{ d.items() | list }} {{ d | list }})J",
          R"J({"d": {"b": 2, "a": 3, "C": 1}})J"),
      "[('a', 3), ('b', 2), ('C', 1)] [('C', 1), ('b', 2), ('a', 3)] [('C', 1), ('b', 2), ('a', "
      "3)] [('b', 2), ('a', 3), ('C', 1)] [('b', 2), ('a', 3), ('C', 1)] ['b', 'a', 'C']");
  EXPECT_EQ(
      Render(
          R"J({{ users | map(attribute='name') | list }} {{ ['a', 'b'] | map('upper') | join }} {{ users | map(attribute='age', default=0) | list }} {{ [[1, 2], [3]] | map('length') | list }} {{ users | map(attribute='0') | list }})J",
          R"J({"users": [{"name": "x", "age": 3}, {"name": "y"}]})J"),
      "['x', 'y'] AB [3, 0] [2, 1] [Undefined, Undefined]");
  EXPECT_EQ(
      Render(
          R"J({{ users | selectattr('admin') | map(attribute='name') | list }} {{ users | rejectattr('admin') | map(attribute='name') | list }} {{ users | selectattr('name', 'equalto', 'y') | list | length }} {{ users | selectattr('age', 'defined') | list | length }} {{ users | selectattr('meta.k', 'eq', 1) | map(attribute='name') | first }})J",
          R"J({"users": [{"name": "x", "admin": true, "age": 3, "meta": {"k": 1}}, {"name": "y", "admin": false}]})J"),
      "['x'] ['y'] 1 1 x");
  EXPECT_EQ(
      Render(
          R"J({{ none | selectattr('x') | list }} {{ missing | map(attribute='x') | list }} {{ (messages | selectattr('role', 'equalto', 'user') | list)[-1].content }} {{ messages | selectattr('role', 'in', ['system', 'assistant']) | list | length }})J",
          R"J({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]})J"),
      "[] [] Bye 2");
  EXPECT_EQ(
      Render(
          R"J({{ 'abc' | attr('upper') is callable }} {{ {'a': 1} | attr('a') is defined }} {{ {'a': 1} | attr('keys') is defined }})J",
          R"J({})J"),
      "True False True");
}

TEST(JinjaTest, ToJson) {
  EXPECT_EQ(Render(R"J({{ x | tojson }})J",
                   R"J({"x": {"b": [1, 2.5, true, null], "a": "é\n\"q\"", "c": {}, "d": []}})J"),
            "{\"b\": [1, 2.5, true, null], \"a\": \"é\\n\\\"q\\\"\", \"c\": {}, \"d\": []}");
  EXPECT_EQ(Render(R"J({{ x | tojson(indent=2) }})J",
                   R"J({"x": {"b": [1, {"k": "v"}], "a": "s", "e": [], "f": {}}})J"),
            "{\n  \"b\": [\n    1,\n    {\n      \"k\": \"v\"\n    }\n  ],\n  \"a\": \"s\",\n  "
            "\"e\": [],\n  \"f\": {}\n}");
  EXPECT_EQ(
      Render(
          R"J({{ x | tojson(indent=2, separators=(',', ': ')) }}|{{ x | tojson(separators=(',', ':')) }}|{{ x | tojson(sort_keys=true) }}|{{ x | tojson(ensure_ascii=true) }})J",
          R"J({"x": {"z": "ü😀", "a": [1.0, 1e+20, 0.001]}})J"),
      "{\n  \"z\": \"ü😀\",\n  \"a\": [\n    1.0,\n    1e+20,\n    0.001\n  "
      "]\n}|{\"z\":\"ü😀\",\"a\":[1.0,1e+20,0.001]}|{\"a\": [1.0, 1e+20, 0.001], \"z\": "
      "\"ü😀\"}|{\"z\": \"\\u00fc\\ud83d\\ude00\", \"a\": [1.0, 1e+20, 0.001]}");
  EXPECT_EQ(
      Render(
          R"J({{ 'x' | tojson }} {{ 1 | tojson }} {{ none | tojson }} {{ '<&>\u2028\x7f' | tojson }} {{ ('a', 1) | tojson }} {{ {1: 'int key', true: 'bool'} | tojson }})J",
          R"J({})J"),
      "\"x\" 1 null \"<&> \177\" [\"a\", 1] {\"1\": \"bool\"}");
  EXPECT_EQ(
      Render(
          R"J({{ tools | tojson }})J",
          R"J({"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}]})J"),
      "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
      "{\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\"}}, "
      "\"required\": [\"location\"]}}}]");
}

TEST(JinjaTest, Globals) {
  EXPECT_EQ(
      Render(
          R"J({{ range(3) | list }} {{ range(1, 4) | list }} {{ range(10, 0, -3) | list }} {% for i in range(2) %}{{ i }}{% endfor %})J",
          R"J({})J"),
      "[0, 1, 2] [1, 2, 3] [10, 7, 4, 1] 01");
  EXPECT_EQ(Render(R"J({{ dict(a=1, b='x') }} {{ dict({'a': 1}, b=2) }} {{ dict([('k', 'v')]) }})J",
                   R"J({})J"),
            "{'a': 1, 'b': 'x'} {'a': 1, 'b': 2} {'k': 'v'}");
  EXPECT_EQ(
      Render(
          R"J({% set c = cycler('a', 'b') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}{% set j = joiner(' | ') %}{% for x in [1, 2, 3] %}{{ j() }}{{ x }}{% endfor %})J",
          R"J({})J"),
      "abab1 | 2 | 3");
  EXPECT_EQ(Render(R"J({{ namespace(a=1) }})J", R"J({})J"), "<Namespace {'a': 1}>");
}

TEST(JinjaTest, StringMethods) {
  EXPECT_EQ(
      Render(
          R"J({{ 'Hello'.upper() }} {{ 'Hello'.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'Hello'.swapcase() }})J",
          R"J({})J"),
      "HELLO hello Hello World Hello hELLO");
  EXPECT_EQ(
      Render(
          R"J([{{ '  x  '.strip() }}] [{{ '  x  '.lstrip() }}] [{{ '  x  '.rstrip() }}] [{{ 'xxhixx'.strip('x') }}] [{{ '\n\nhi\n'.lstrip('\n') }}] [{{ 'ab.txt'.rstrip('.txt') }}])J",
          R"J({})J"),
      "[x] [x  ] [  x] [hi] [hi\n] [ab]");
  EXPECT_EQ(
      Render(
          R"J({{ 'a,b,,c'.split(',') }} {{ '  a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ '  a b  c '.split(none, 1) }} {{ ' a b  c  '.rsplit(none, 1) }} {{ '<think>x</think>y'.split('</think>')[-1] }})J",
          R"J({})J"),
      "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a b', 'c'] ['a', 'b  c '] [' a b', 'c'] y");
  EXPECT_EQ(
      Render(
          R"J({{ 'abc'.startswith('ab') }} {{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'.endswith('bc') }} {{ 'abc'.startswith('b', 1) }} {{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'héllo'.find('l') }} {{ 'hello'.index('e') }} {{ 'banana'.count('an') }})J",
          R"J({})J"),
      "True True True True 2 3 -1 2 1 2");
  EXPECT_EQ(
      Render(
          R"J({{ 'aXbX'.replace('X', '-') }} {{ 'aXbX'.replace('X', '-', 1) }} {{ ', '.join(['a', 'b']) }} {{ '{} + {} = {}'.format(1, 2, 3) }} {{ '{0}{1}{0}'.format('a', 'b') }} {{ '{name}: {v:>5}|{v:<4}|{f:.2f}|{n:05d}|{n:,}'.format(name='x', v='ab', f=3.14159, n=1234) }})J",
          R"J({})J"),
      "a-b- a-bX a, b 1 + 2 = 3 aba x:    ab|ab  |3.14|01234|1,234");
  EXPECT_EQ(
      Render(
          R"J({{ 'a\nb\r\nc'.splitlines() }} {{ '123'.isdigit() }} {{ '12a'.isdigit() }} {{ 'abc'.isalpha() }} {{ 'ab1'.isalnum() }} {{ ' \t'.isspace() }} {{ 'abc'.islower() }} {{ 'ABC'.isupper() }} {{ ''.isdigit() }})J",
          R"J({})J"),
      "['a', 'b', 'c'] True False True True True True True False");
  EXPECT_EQ(
      Render(
          R"J({{ 'prefix_x'.removeprefix('prefix_') }} {{ 'x.py'.removesuffix('.py') }} {{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} [{{ 'x'.ljust(3) }}] [{{ 'x'.rjust(3, '.') }}] [{{ 'x'.center(4, '*') }}] {{ '42'.zfill(5) }})J",
          R"J({})J"),
      "x x ('a', '=', 'b=c') ('a=b', '=', 'c') [x  ] [..x] [*x**] 00042");
}

TEST(JinjaTest, DictAndListMethods) {
  EXPECT_EQ(
      Render(
          R"J({{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 0) }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {{ d.copy() }})J",
          R"J({"d": {"a": 1, "b": 2}})J"),
      "1 None 0 ['a', 'b'] [1, 2] [('a', 1), ('b', 2)] {'a': 1, 'b': 2}");
  EXPECT_EQ(Render(R"J({{ l.index(2) }} {{ l.count(1) }} {{ (1, 2, 1).count(1) }} {{ 'x' in l }})J",
                   R"J({"l": [1, 2, 1]})J"),
            "1 2 2 False");
}

TEST(JinjaTest, UndefinedSemantics) {
  EXPECT_EQ(
      Render(
          R"J([{{ missing }}] {{ missing is defined }} {{ missing | length }} {{ missing | list }} {{ missing | string }} [{{ missing | trim }}] {{ missing | default('d') }} {% for x in missing %}never{% endfor %}{{ not missing }})J",
          R"J({})J"),
      "[] False 0 []  [] d True");
  EXPECT_EQ(
      Render(
          R"J({{ m.content is defined }} {{ m.content | default('none') }} {% if m.tool_calls %}calls{% else %}no calls{% endif %} {{ (m.missing.deeper is defined) if m.missing is defined else 'guarded' }})J",
          R"J({"m": {"role": "user"}})J"),
      "False none no calls guarded");
}

TEST(JinjaTest, Unicode) {
  EXPECT_EQ(
      Render(
          R"J({{ s | length }} {{ s[0] }} {{ s[-1] }} {{ s[1:3] }} {{ s[::-1] }} {{ s | upper }} {{ s | title }} {{ s | center(11) }})J",
          R"J({"s": "ñandú 🙂 ǅx"})J"),
      "10 ñ x an xǅ 🙂 údnañ ÑANDÚ 🙂 ǄX Ñandú 🙂 Ǆx  ñandú 🙂 ǅx");
  EXPECT_EQ(
      Render(
          R"J({{ 'Straße'.upper() }} {{ 'ÉCOLE'.lower() }} {{ '東京'|length }} {{ 'a\u00a0b'.split() }} {{ '\u3000x\u3000'.strip() }})J",
          R"J({})J"),
      "STRASSE école 2 ['a', 'b'] x");
}

TEST(JinjaTest, StrftimeNow) {
  EXPECT_EQ(
      Render(
          R"J({{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d %H:%M:%S') }} {{ strftime_now('%B %d, %A') }})J",
          R"J({})J"),
      "26 Jul 2025 2025-07-26 14:30:05 July 26, Saturday");
}

TEST(JinjaTest, ErrorsName) {
  // jinja2: TemplateAssertionError: No filter named 'nosuchfilter'.
  ExpectParseError("a\nb\n{{ x | nosuchfilter }}", "line 3: unknown filter 'nosuchfilter'");
  EXPECT_EQ(Render(R"J({% if false %}{{ x | nosuchfilter }}{% endif %}ok)J", "{}"), "ok");
  // jinja2: TemplateAssertionError: No test named 'nosuchtest'.
  ExpectParseError(R"J({{ x is nosuchtest }})J", "line 1: unknown test 'nosuchtest'");
  // jinja2: TypeError: no loader for this environment specified
  ExpectParseError("\n\n{% include 'other.jinja' %}", "line 3: unsupported statement 'include'");
  // jinja2: TypeError: no loader for this environment specified
  ExpectParseError(R"J({% extends 'base' %})J", "line 1: unsupported statement 'extends'");
  // jinja2: TypeError: no loader for this environment specified
  ExpectParseError(R"J({% import 'x' as y %})J", "unsupported statement 'import'");
  // jinja2: TemplateSyntaxError: Encountered unknown tag 'do'.
  ExpectParseError(R"J({% do x %})J", "line 1: unknown statement 'do'");
  // jinja2: TemplateSyntaxError: Unexpected end of template. Jinja was looking for the following
  // tags:
  ExpectParseError(R"J({% if true %})J", "line 1: unexpected end of template");
  // jinja2: TemplateSyntaxError: unexpected 'end of print statement'
  ExpectParseError(R"J({{ 1 + }})J", "line 1:");
  // jinja2: SyntaxError: 'break' outside loop (<template>, line 11)
  ExpectParseError(R"J({% break %})J", "'break' outside loop");
  // jinja2: TemplateSyntaxError: unexpected char "'" at 3
  ExpectParseError(R"J({{ 'unterminated }})J", "line 1:");
  // jinja2: TemplateSyntaxError: Missing end of comment tag
  ExpectParseError(R"J({# never closed)J", "comment");
}

TEST(JinjaTest, RuntimeErrors) {
  // jinja2: TemplateError: Conversation roles must alternate!
  ExpectRenderError(R"J({{ raise_exception('Conversation roles must alternate!') }})J", R"J({})J",
                    "Conversation roles must alternate!");
  // jinja2: TemplateError: System role not supported
  ExpectRenderError(
      R"J({% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% endfor %})J",
      R"J({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]})J",
      "System role not supported");
  // jinja2: UndefinedError: 'x' is undefined
  ExpectRenderError(R"J({{ x.y.z }})J", R"J({})J", "line 1: 'x' is undefined");
  // jinja2: UndefinedError: 'dict object' has no attribute 'a'
  ExpectRenderError(R"J({{ m.a.b }})J", R"J({"m": {}})J",
                    "line 1: 'dict object' has no attribute 'a'");
  // jinja2: UndefinedError: 'missing' is undefined
  ExpectRenderError(R"J({{ missing() }})J", R"J({})J", "'missing' is undefined");
  // jinja2: UndefinedError: 'missing' is undefined
  ExpectRenderError(R"J({{ missing + 1 }})J", R"J({})J", "'missing' is undefined");
  // jinja2: SecurityError: access to attribute 'append' of 'list' object is unsafe.
  ExpectRenderError(R"J({% set ns = namespace(l=[]) %}{% set _ = ns.l.append(1) %})J", R"J({})J",
                    "access to attribute 'append' of 'list' object is unsafe.");
  // jinja2: SecurityError: access to attribute 'update' of 'dict' object is unsafe.
  ExpectRenderError(R"J({% set d = {} %}{{ d.update({'a': 1}) }})J", R"J({})J",
                    "access to attribute 'update' of 'dict' object is unsafe.");
  // jinja2: ZeroDivisionError: division by zero
  ExpectRenderError(R"J({{ 1 / 0 }})J", R"J({})J", "division by zero");
  // jinja2: TemplateRuntimeError: No test named 'nosuchtest' found.
  ExpectRenderError(R"J({% if x is nosuchtest %}{% endif %})J", R"J({})J",
                    "No test named 'nosuchtest'");
  // jinja2: TypeError: can only concatenate str (not "int") to str
  ExpectRenderError(R"J({{ 'a' + 1 }})J", R"J({})J", "can only concatenate str");
  // jinja2: TypeError: object of type 'NoneType' has no len()
  ExpectRenderError(R"J({{ none | length }})J", R"J({})J", "has no len()");
  // jinja2: TypeError: 'NoneType' object is not iterable
  ExpectRenderError(R"J({% for x in none %}{% endfor %})J", R"J({})J",
                    "'NoneType' object is not iterable");
  // jinja2: TemplateRuntimeError: cannot assign attribute on non-namespace object
  ExpectRenderError(R"J({% set x = 1 %}{% set x.a = 2 %})J", R"J({})J",
                    "cannot assign attribute on non-namespace object");
  // jinja2: SecurityError: Chat templates cannot store underscore-prefixed attributes on a
  // namespace,
  ExpectRenderError(R"J({% set ns = namespace() %}{% set ns._secret = 1 %})J", R"J({})J",
                    "underscore-prefixed");
  // jinja2: OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).
  ExpectRenderError(R"J({{ range(1000000) | length }})J", R"J({})J", "Range too big");
  // jinja2: TypeError: Object of type Undefined is not JSON serializable
  ExpectRenderError(R"J({{ {'a': 1} | tojson }}{{ missing | tojson }})J", R"J({})J",
                    "not JSON serializable");
  // jinja2: TypeError: '<' not supported between instances of 'str' and 'int'
  ExpectRenderError(R"J({{ [1, 'a'] | sort }})J", R"J({})J",
                    "'<' not supported between instances of 'str' and 'int'");
}

TEST(JinjaTest, RaiseExceptionMessageIsExact) {
  absl::Status status = RenderStatus("\n\n{{ raise_exception('Only user and assistant roles!') }}");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "Only user and assistant roles!");
}

TEST(JinjaTest, UnknownFilterNamesTheFilterAndLine) {
  auto tmpl = Template::Parse("{% for m in messages %}\n\n{{ m | frobnicate }}\n{% endfor %}");
  ASSERT_FALSE(tmpl.ok());
  EXPECT_EQ(tmpl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tmpl.status().message(), "line 3: unknown filter 'frobnicate'");
}

TEST(JinjaTest, TemplatesAreReusableAndContextOrderIsKept) {
  auto tmpl = Template::Parse("{{ x | tojson }}");
  ASSERT_TRUE(tmpl.ok());
  for (int i = 0; i < 3; ++i) {
    auto text = tmpl->Render(nlohmann::ordered_json::parse(R"({"x": {"z": 1, "a": 2, "m": 3}})"));
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, R"({"z": 1, "a": 2, "m": 3})");
  }
  auto status = tmpl->Render(nlohmann::ordered_json::array());
  EXPECT_FALSE(status.ok());
}

// Hostile templates and inputs fail with an error; none crashes or hangs.
TEST(JinjaTest, DeepRecursionIsAnErrorNotACrash) {
  absl::Status status = RenderStatus("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  std::string deep(100000, '(');
  auto parsed = Template::Parse("{{ " + deep + "1" + std::string(100000, ')') + " }}");
  EXPECT_FALSE(parsed.ok());
  std::string nested;
  for (int i = 0; i < 5000; ++i) nested += "{% if true %}";
  EXPECT_FALSE(Template::Parse(nested).ok());
  std::string json(100000, '[');
  json += std::string(100000, ']');
  auto tmpl = Template::Parse("{{ x }}");
  ASSERT_TRUE(tmpl.ok());
  nlohmann::ordered_json context;
  context["x"] = nlohmann::ordered_json::parse(json);
  EXPECT_FALSE(tmpl->Render(context).ok());
}

TEST(JinjaTest, RunawayLoopsAndOutputAreErrors) {
  absl::Status status = RenderStatus(
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  status = RenderStatus(
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{{ ns.s }}");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  status = RenderStatus("{{ 'x' * 100000000000 }}");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  status = RenderStatus(
      "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}"
      "{% endfor %}");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
}

TEST(JinjaTest, CyclicNamespacesDoNotCrash) {
  // jinja2 prints the cycle with its recursion guard; we fail instead.
  absl::Status status = RenderStatus("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}");
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(Render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me is defined }}"),
            "True");
}

TEST(JinjaTest, InvalidUtf8PassesThroughUnchanged) {
  EXPECT_EQ(Render("a\xff{{ '\xfe' }}b"),
            "a\xff\xfe"
            "b");
  EXPECT_EQ(Render("{{ s | length }}", R"({"s": "abc"})"), "3");
}

}  // namespace
}  // namespace tandem::jinja
