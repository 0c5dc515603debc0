"""What Python's `regex` module (the one transformers imports as `re` for response parsing) answers for a corpus of
str patterns, for the PythonRegex engine in Sources/VLMTemplates (checked by Tests/VLMTemplatesTests/PythonRegexTests).

For every pattern (compiled as is, or with DOTALL as transformers compiles its delimiters): its group count and
`groupindex`, then cases: `search(text, pos)` with and without `partial=True`, `fullmatch(text)`, `finditer(text, pos)`
and `sub(template, text)`; each answer is None or the match's span, `partial` flag and every numbered group's span
(null when the group did not take part), a `finditer` a list of those, a `sub` the resulting text. Offsets are Python
str indexes (Unicode scalars). Then the patterns that must not compile: the module's own syntax errors (its message is
recorded) and the constructs PythonRegex refuses although the module accepts them (the Swift init must throw, naming the
construct). Then `regex.escape` of a few literals. Last, `divergences`: cases where PythonRegex knowingly answers
otherwise, each with the kind of difference the Swift test allows (see the entries' notes).

Writes Tests/Fixtures/chat-templates/python-regex.json (sorted keys, stable order: running it twice gives the same
bytes).
Run from the repository root with the oracle venv: python oracle/python_regex.py
"""
import json
import os

import regex

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "Tests", "Fixtures", "chat-templates", "python-regex.json")

# Characters whose classes differ between engines or Unicode definitions: Latin with accent, Arabic-Indic digit
# three, NBSP, LINE SEPARATOR, a CJK ideograph, a combining acute, an emoji (one scalar), the information separator
# U+001C (re's \s, not regex's), ZERO WIDTH SPACE, ZERO WIDTH JOINER, superscript two, ROMAN NUMERAL ONE, underscore,
# vertical tab, EN SPACE, fullwidth digit one.
UNICODE_SAMPLE = "aé٣\u00a0\u2028中e\u0301😀\x1c\u200b\u200d²\u2160_\x0b\u2002１Z \t\n"


def search(text, pos=0):
    return {"op": "search", "text": text, "pos": pos, "partial": False}


def partial(text, pos=0):
    return {"op": "search", "text": text, "pos": pos, "partial": True}


def both(text, pos=0):
    return [search(text, pos), partial(text, pos)]


def fullmatch(text):
    return {"op": "fullmatch", "text": text}


def finditer(text, pos=0):
    return {"op": "finditer", "text": text, "pos": pos}


def sub(text, template):
    return {"op": "sub", "text": text, "template": template}


def flat(cases):
    out = []
    for case in cases:
        out.extend(case if isinstance(case, list) else [case])
    return out


# (pattern, dotall, cases), grouped by what they exercise.
PATTERNS = [
    # Literals and escapes.
    ("abc", False, [both("xxabcabc"), both("ab"), search("abc", 1), finditer("abcabc"), fullmatch("abc"), fullmatch("abcd")]),
    (r"a\.b\|c\\d", False, [search(r"xa.b|c\d"), search("axb|c\\d")]),
    (r"\n\t\r\f\v\a", False, [search("x\n\t\r\f\v\x07")]),
    (r"\x41\u00e9\U0001F600", False, [search("zAé😀"), partial("zAé")]),
    (r"\0\01\101\141\07", False, [search("\x00\x01Aa\x07")]),
    (r"\08", False, [search("\x008")]),
    (r"\{\}\[\]\(\)\*\+\?\^\$", False, [search("{}[]()*+?^$")]),
    (r"\-\ \é\_\/\#\&\~", False, [search("- é_/#&~")]),
    (r"a{", False, [search("a{b")]),
    (r"a{x}", False, [search("a{x}")]),
    (r"a{1 }", False, [search("a{1 }")]),
    (r"a{}", False, [search("a{}")]),
    (r"{", False, [search("x{")]),
    (r"x{2}{", False, [search("xx{")]),
    (r"a{,}", False, [search("aaa")]),
    (r"😀+", False, [search("a😀😀b"), finditer("😀x😀😀")]),
    ("日本", False, [both("これは日本語"), partial("これは日")]),
    # Sets.
    (r"[abc]+", False, [search("xxcabd")]),
    (r"[a-z]+", False, [search("12abZ")]),
    (r"[^a-z]+", False, [search("ab12Cd")]),
    (r"[\d\s]+", False, [search("ab1 2\u00a03x")]),
    (r"[^\w]", False, [search("ab_1é!")]),
    (r"[\]]", False, [search("a]")]),
    (r"[]a]+", False, [search("x]a]")]),
    (r"[^]a]", False, [search("]ab")]),
    (r"[a-]+", False, [search("x-a-")]),
    (r"[-a]+", False, [search("x-a-")]),
    (r"[a-\d]+", False, [search("x-a5b")]),
    (r"[\d-z]+", False, [search("x-5zy")]),
    (r"[[a]+", False, [search("x[a[")]),
    (r"[a[b]]", False, [search("b]"), search("b")]),
    (r"[a&&b]", False, [search("&")]),
    (r"[\b]", False, [search("a\x08")]),
    (r"[\n\t]+", False, [search("a\n\tb")]),
    (r"[\x41-\x43]+", False, [search("zABCD")]),
    (r"[é-ë]+", False, [search("aéêëì")]),
    (r"[\u4e00-\u9fff]+", False, [search("abc中文def")]),
    (r"[^>\n]+", False, [search(">ab\ncd"), finditer(">ab\ncd>")]),
    (r"[\s\S]+", False, [search("a\nb")]),
    (r"[^\s]+", False, [search("  ab c")]),
    (r"[.*+?]+", False, [search("a.*+?b")]),
    (r"[\\^]+", False, [search("a\\^b")]),
    (r"[a^]+", False, [search("^a")]),
    (r"[\p{Lu}\d]+", False, [search("aBC1d")]),
    (r"\p{L}+", False, [search("12中文é3")]),
    (r"\P{L}+", False, [search("ab12!c")]),
    (r"\p{N}+", False, [search("a²٣1b")]),
    (r"\pN", False, [search("aⅠ")]),
    (r"[\w&&\d]+", False, [search("a&1")]),
    # The dot.
    (".", False, [finditer("a\nb\r\u2028c")]),
    (".", True, [finditer("a\nb")]),
    ("a.c", False, [search("a\nc abc")]),
    ("a.c", True, [search("a\nc abc")]),
    (".+", False, [search("ab\ncd")]),
    ("(?s).+", False, [search("ab\ncd")]),
    # Class escapes against the module's Unicode definitions.
    (r"\s", False, [finditer(UNICODE_SAMPLE)]),
    (r"\S", False, [finditer(UNICODE_SAMPLE)]),
    (r"\w", False, [finditer(UNICODE_SAMPLE)]),
    (r"\W", False, [finditer(UNICODE_SAMPLE)]),
    (r"\d", False, [finditer(UNICODE_SAMPLE)]),
    (r"\D", False, [finditer(UNICODE_SAMPLE)]),
    (r"\b", False, [finditer(UNICODE_SAMPLE)]),
    (r"\B", False, [finditer("ab é٣ x\u0301 😀!")]),
    (r"\w+", False, [finditer("hello wörld ١٢٣ naïve e\u0301 中文 snake_case")]),
    # Anchors.
    ("^a", False, [search("ab"), search("ba"), search("ab", 1), finditer("a\na")]),
    ("(?m)^a", False, [finditer("a\na\nba"), search("b\na", 1)]),
    ("a$", False, [search("a"), search("a\n"), search("a\n\n"), search("a\nb")]),
    ("(?m)a$", False, [finditer("a\na\nab")]),
    ("$", False, [finditer("a\nb\n")]),
    ("(?m)$", False, [finditer("a\nb\n")]),
    ("(?m)^", False, [finditer("a\nb\n")]),
    (r"a\Z", False, [search("a"), search("a\n")]),
    (r"a\z", False, [search("a"), search("a\n")]),
    (r"\Aab", False, [search("ab"), search("xab"), search("ab", 1)]),
    (r"\bab\b", False, [search("xab ab"), search("ab", 0), search("xab", 1)]),
    (r"\Bb", False, [search("ab"), search("b")]),
    (r"\b", False, [search(""), search("a"), search("!"), finditer("ab cd")]),
    (r"\B", False, [search(""), finditer("ab cd")]),
    # Groups.
    ("(a)(b)?(c)", False, [search("ac"), search("abc")]),
    ("(?:ab)+", False, [search("ababa")]),
    ("(?P<first>a)(?P<second>b)?", False, [search("a"), search("ab")]),
    ("(?<first>x)(?<second>y)", False, [search("axy")]),
    ("((a)|b)+", False, [search("ab"), search("ba")]),
    ("(a|(b))+", False, [search("ab"), search("ba")]),
    ("(a*)+b", False, [search("aab")]),
    ("(a?)*", False, [search("aa")]),
    ("(a|)*", False, [search("aab")]),
    ("(a*)*", False, [search("b")]),
    ("(?:(a)|b)*", False, [search("ab"), search("ba")]),
    ("(?P<a>x)(?P<a>y)?", False, [search("xy"), search("x")]),
    ("((((((((((a))))))))))", False, [search("a")]),
    ("(a)|(b)|(c)", False, [finditer("cba")]),
    # Alternation is leftmost-first.
    ("a|ab", False, [search("ab"), fullmatch("ab")]),
    ("ab|a", False, [search("ab")]),
    ("a|", False, [finditer("bab")]),
    ("|a", False, [finditer("ab")]),
    ("(?:a|ab)(?:c|bcd)", False, [search("abcd"), fullmatch("abcd")]),
    # Quantifiers.
    ("a*", False, [search("baaa"), search("aaab")]),
    ("a+", False, [search("baaa")]),
    ("a?", False, [finditer("aba")]),
    ("a{2}", False, [search("aaaa"), finditer("aaaaa")]),
    ("a{2,}", False, [search("aaaaa")]),
    ("a{,2}", False, [search("aaaa")]),
    ("a{1,3}", False, [finditer("aaaaa")]),
    ("a*?", False, [search("aaa"), fullmatch("aaa")]),
    ("a+?", False, [search("aaa")]),
    ("a??b", False, [search("ab")]),
    ("a{2,}?", False, [search("aaaa")]),
    ("a{,2}?b", False, [search("aab")]),
    ("a{1,3}?", False, [finditer("aaaaa")]),
    ("a*+a", False, [search("aaa")]),
    ("a++b", False, [search("aab")]),
    ("a?+a", False, [search("a")]),
    ("a{1,2}+a", False, [search("aaa"), search("aa")]),
    ("(?>a+)b", False, [search("aab"), search("aa")]),
    ("(?>a|ab)c", False, [search("abc"), search("ac")]),
    ("(?:ab){2}", False, [search("abababx")]),
    ("(?:ab){1,2}?c", False, [search("ababc")]),
    ("(a|b){2,3}", False, [search("ababab")]),
    ("(?:a{2}){2}", False, [search("aaaaa")]),
    ("(?:x|y)*?z", False, [search("xyxz")]),
    ("(?:)*", False, [search("a")]),
    ("(?=a)*a", False, [search("a")]),
    ("^*a", False, [search("ba")]),
    (r"\b+a", False, [search("a")]),
    ("a{0}", False, [search("a")]),
    ("(a){0}b", False, [search("ab")]),
    ("x{100000}", False, [search("x")]),
    # Lookarounds.
    ("a(?=b)", False, [search("acab")]),
    ("a(?!b)", False, [search("abac")]),
    ("(?<=a)b", False, [search("cbab"), search("ab", 1)]),
    ("(?<!a)b", False, [search("abcb")]),
    ("(?<=a+)b", False, [search("xaab")]),
    ("(?<=ab|b)c", False, [search("abc"), search("bc")]),
    ("(?<=(a)b|(b))c", False, [search("abc")]),
    (r"(?<=(\w)+)c", False, [search("abc")]),
    (r"(?<=(\w+?))c", False, [search("abc")]),
    (r"(?<=\1(a))b", False, [search("aab")]),
    ("(?<=^a)b", False, [search("ab")]),
    (r"(?<=\ba)b", False, [search("ab"), search("cab")]),
    ("(?<=a(?=b))b", False, [search("ab")]),
    ("(?=(a+))a*b", False, [search("aab")]),
    ("(?!(a))b", False, [search("ab")]),
    ("x(?=y)(?<=x)", False, [search("xy")]),
    # Back-references.
    (r"(a)\1", False, [search("aa"), search("ab")]),
    (r"(?P<q>['\"]).*?(?P=q)", False, [search("say 'hi\" there' ok")]),
    (r"(a)\g<1>", False, [search("aa")]),
    (r"(?<n>a)\g<n>", False, [search("aa"), search("ab")]),
    (r"\1(a)", False, [search("aa")]),
    (r"(?P=n)(?P<n>a)", False, [search("aa")]),
    (r"(a)|\1b", False, [search("b")]),
    (r"(a)(?P=1)", False, [search("aa")]),
    (r"\gx", False, [search("gx")]),
    (r"\g<0>", False, [search("g<0>")]),
    (r"(a\g<1>)", False, [search("ag<1>")]),
    (r"(?i)(a)\1", False, [search("aA")]),
    # Inline flags.
    ("(?i)abc", False, [search("xAbC")]),
    ("a(?i)b", False, [search("aB"), search("AB")]),
    ("(?i)a(?-i)b", False, [search("AB"), search("Ab")]),
    ("(?i:a)b", False, [search("Ab"), search("AB")]),
    ("(?:a(?i)b)c", False, [search("aBC"), search("aBc")]),
    ("a(?i)b|c", False, [search("C")]),
    ("c|a(?i)b", False, [search("C")]),
    (".(?s).", False, [search("\n\n"), search("a\n")]),
    ("(?s:a.)b.", False, [search("a\nb\n"), search("a\nbc")]),
    ("(?m:^b)", False, [search("a\nb")]),
    ("(?-s:.)", True, [search("\na")]),
    ("(?ims)^a.", False, [search("x\nA\n")]),
    ("(?)a", False, [search("a")]),
    ("(?u)\\w", False, [search("é")]),
    ("a(?#comment)*", False, [search("aaa")]),
    ("a(?i)*", False, [search("aa")]),
    # Case-insensitive matching.
    ("(?i)é", False, [search("É")]),
    ("(?i)ſ", False, [search("S")]),
    ("(?i)s", False, [search("ſ")]),
    ("(?i)k", False, [search("\u212a")]),
    ("(?i)ß", False, [search("ẞ"), search("ss")]),
    ("(?i)σ", False, [search("ς"), search("Σ")]),
    ("(?i)i", False, [search("İ"), search("ı"), search("I")]),
    ("(?i)I", False, [search("ı"), search("İ")]),
    ("(?i)İ", False, [search("i"), search("I")]),
    ("(?i)ı", False, [search("I"), search("i")]),
    ("(?i)[a-z]+", False, [search("ABC\u212a")]),
    ("(?i)[^a]", False, [search("Ab")]),
    ("(?i)[k]", False, [search("\u212a")]),
    ("(?i)Straße", False, [search("STRAẞE")]),
    ("(?i)ǅ", False, [search("ǆ"), search("Ǆ")]),
    ("(?i)µ", False, [search("μ"), search("Μ")]),
    (r"(?i)\w+", False, [search("ÀÉÎ")]),
    # Empty matches and finditer.
    ("a*", False, [finditer("baaac"), finditer("baaac", 2)]),
    ("", False, [finditer("abc"), finditer(""), search("", 0), partial("")]),
    ("x*", False, [finditer("axx", 1)]),
    ("(?:)|b", False, [finditer("abc")]),
    ("a|b|", False, [finditer("cab")]),
    (r"\s*", False, [finditer("a  b")]),
    ("(?=b)|b", False, [finditer("abb")]),
    # Search from a position: pos does not slice the text.
    ("^", False, [search("ab", 1), search("ab", 0)]),
    ("a", False, [search("ba", -1), search("ab", -1), search("ab", -5), search("ab", 5), partial("ab", 5)]),
    ("", False, [search("ab", 5), partial("ab", 5), search("ab", -1)]),
    (r"\w+", False, [search("hello world", 3), search("hello world", 11)]),
    # Full matches.
    ("a|ab", False, [fullmatch("a"), fullmatch("b")]),
    (".*", False, [fullmatch("ab\n"), fullmatch("ab")]),
    (r"\d+", False, [fullmatch("١٢٣"), fullmatch("12a")]),
    (r"\{(\w+(?:\.\w+)*)\}", False, [fullmatch("{content}"), fullmatch("{content.args.x}"), fullmatch("x{content}"),
                                     fullmatch("{content} "), search("a {b.c} d"), partial("{content.ar")]),
    # The regex module is not re.
    (r"\s", False, [search("\x1c\x1d\x1e\x1f"), search("\x85")]),
    (r"\d", False, [search("x٣"), search("x²"), search("x１")]),
    ("a$", False, [search("a\n")]),
    # Replacement templates.
    ("(a)(b)?", False, [sub("ab a", r"[\1|\2]")]),
    ("(?P<n>a)", False, [sub("xa", r"\g<n>\g<1>\g<0>")]),
    ("a", False, [sub("a", r"\n\t\\"), sub("a", r"\&"), sub("a", r"\0"), sub("a", r"\012"), sub("b", r"\2"),
                  sub("a", r"\x41\u00e9"), sub("a", r"\a\b\f\v\r"), sub("a", "é\\é")]),
    ("(a)", False, [sub("a", r"\1 0"), sub("a", r"\g<01>"), sub("a", r"\10")]),
    ("(a)|b", False, [sub("ab", r"[\1]")]),
    ("a*", False, [sub("baaac", "-")]),
    ("", False, [sub("abc", "-")]),
    (r"(?<=[{,])(\w+):", False, [sub("{a:1,b:2, c:3}", r'"\1":'), finditer("{key: 1,other:2}"),
                                  partial("{ke"), partial("x,abc:", 2)]),
    (regex.escape("<|s|>") + r"(.*?)" + regex.escape("<|e|>"), True,
     [sub('{"a": <|s|>x "y"\nz<|e|>, "b": <|s|><|e|>}', "@"), finditer("<|s|>a<|e|> <|s|>b")]),
    # transformers' response-template delimiters, complete and cut short.
    (r"\s*<tool_call>", True, flat([both("hello <tool"), both("hello <tool_call>"), both("hello <tool_call"),
                                    both("abc   "), both(""), both("<"), both("x <tool_call> y <tool"),
                                    both("<tool_call>"), both("   <tool_call>\n<tool"), partial("hello <tool", 6),
                                    partial("hello <tool", 11), partial("a <tool_call> b <tool", 3),
                                    partial("😀 <tool"), partial("<tool_cal"), partial("<tool_calx <tool")])),
    (r"\s*<x>", True, flat([both("abc   "), both("abc   <"), both("abc < x"), partial("a<x b"), partial("  <x> ")])),
    # inkling's delimiters: optional items, then a run no item can start inside (searches go on at the run's end).
    (r"(?:<\|message_model\|>)?[^<]*<\|content_text\|>", True,
     flat([both("word " * 40), both("ab <x cd <|content_text|>"), both("ab<|message_model|>cd<|content_text|>e"),
           both("a<<|content_text|>"), both("<|message_model|><|message_model|>x<|content_text|>"),
           both("xy<|message_model|>z<|content_te"), search("abc<|content_text|>", 2), both("<|content_tex")])),
    (r"(?:ab)?(?:c|d)?x+y", True, flat([both("xxxz abxy"), both("zxxcxxy"), both("dxxx"), finditer("xy abxxy cxy")])),
    (r"(?i)(?:K)?[^k]*z", True, flat([both("abKcz"), both("ab kz"), both("k" * 3)])),
    ("abc|b", True, flat([both("ab"), both("abx"), both("xab")])),
    ("ab|abc", True, [partial("ab"), partial("ab c"), partial("xabc")]),
    ("abc|ab", True, [partial("ab"), partial("abc")]),
    ("ab|abcd", True, [partial("abc")]),
    ("x|abc", True, [partial("ab x"), partial("x ab")]),
    (r"</function>\s*</tool_call>", True, flat([both("a</function>\n  </tool"), both("a</function>"),
                                                both("a</func"), both("a</function>\n</tool_call>")])),
    (r"\s*(?:<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>)", True,
     flat([both("Hi<|im"), both("Hi <|"), both("Hi <|e"), both("Hi<|eot_id|>"), both("Hi\n\n"), both("Hi <|end"),
           partial("Hi <|im_end|> more <|im")])),
    (r"\s*<tool_call>\s*<function=(?P<name>[^>\n]+)>", True,
     flat([both("x <tool_call>\n<function=get_we"), both("x <tool_call>\n<function=get_weather>"),
           both("<tool_call><function=a\nb>"), both("<tool_call>  "), partial("<tool_call>\n<func")])),
    (r"<parameter=(?P<key>[^>\n]+)>\s*(?P<value>.*?)\s*</parameter>", True,
     flat([both("<parameter=city>\nParis\n</param"), both("<parameter=city>Paris"),
           finditer("<parameter=a>\n1\n</parameter>\n<parameter=b>two words </parameter>"),
           finditer("<parameter=a>x</parameter><parameter=bad\n>y</parameter>"), partial("<parameter=ci")])),
    (r"<\|tool_call>call:(?P<name>\w+)", True,
     flat([both("<|tool_call>call:get_w"), both("<|tool_call>call:"), both("<|tool_ca"), both("x<|tool_call>call:f{")])),
    (r"<think>(.*?)</think>", True,
     flat([both("<think>abc"), both("<think>abc</th"), both("<think>a</think>b"), both("x<th"),
           partial("<think>abc</think")])),
    (r"<think>(.*?)</think>", False, flat([both("<think>ab\nc"), partial("<think>a\nb</th")])),
    (r"<think>(.*?)(?:</think>|<\|im_end\|>)", True,
     flat([both("<think>abc</th"), both("<think>abc<|im"), both("<think>abc"), both("<think>a</think>b"),
           both("<think>a<|im_end|>")])),
    (r"<tool_call>\s*(?P<body>.*?)\s*</tool_call>", True,
     flat([both("<tool_call>\n{}\n</tool_call>"), both("<tool_call>\n{} </tool"), both("<tool_call> {"),
           finditer("<tool_call>a</tool_call> <tool_call>b</tool_call>")])),
    (r"x(.*?)(?:</a>|</b>)", True, flat([both("x12</"), both("x12</b"), both("x1</b>")])),
    (r"<tool_call>\n(?P<json>\{.*?\})\n</tool_call>", True,
     flat([both('<tool_call>\n{"name": "f"}\n</tool_call>'), partial('<tool_call>\n{"name": "f"}\n</to'),
           partial('<tool_call>\n{"na')])),
    (r"\[TOOL_CALLS\]\s*(?:\[|\{)", True, flat([both("text [TOOL_CAL"), both("[TOOL_CALLS] ["), both("[TOOL_CALLS]  ")])),
    ("```(?:json)?\\s*", True, flat([both("a ``"), both("a ```js"), both("```json\n")])),
    (r"(?:\n|^)Action:\s*", True, flat([both("x\nAct"), both("Action: y"), both("x\nAction:")])),
    # Partial matching rules.
    ("ab+", True, [partial("xabb"), partial("xa")]),
    (r"\d+", True, [partial("12"), partial("x12y")]),
    ("abc", True, [partial("ab abc"), partial("abc ab"), partial("xab"), partial("")]),
    ("q", True, [partial("abc"), partial("")]),
    ("(a)(b)?(c)", True, [partial("ab"), partial("a"), partial("xa")]),
    ("(?:ab)+c", True, [partial("abab"), partial("ababx")]),
    ("(ab){2}", True, [partial("aba"), partial("abab")]),
    ("(?:ab){2,}", True, [partial("ab"), partial("abab")]),
    ("a{3}", True, [partial("xaa")]),
    ("(?:ab)+", True, [partial("ababa")]),
    ("a.*?b", True, [partial("xxa yyy"), partial("xxa\nyy")]),
    ("a.*?b", False, [partial("xxa\nyy"), partial("xxa yy")]),
    ("ab(?=c)", True, [partial("ab"), partial("xab"), partial("abd")]),
    ("ab(?!c)", True, [partial("ab"), partial("xab")]),
    ("(?=ab)a", True, [partial("a")]),
    ("(?!ab)a", True, [partial("a")]),
    ("a(?<=a)", True, [partial("xa")]),
    ("a(?<=ab)", True, [partial("a")]),
    ("a$", True, [partial("a"), partial("ab")]),
    (r"a\Z", True, [partial("a")]),
    (r"a\b", True, [partial("a")]),
    (r"a\B", True, [partial("a"), partial("ab")]),
    (r"a\Zb", True, [partial("a")]),
    ("$a", True, [partial("a")]),
    ("x^", True, [partial("x"), partial("xx")]),
    (r"x\Ay", True, [partial("xx")]),
    ("^b", True, [partial("ab"), partial("a"), partial(""), partial("b"), partial("ab", 1)]),
    ("^bc", True, [partial("b")]),
    (r"\Ab", True, [partial("ab")]),
    ("(?:^b|^c)", True, [partial("a")]),
    (r"\A\s*b", True, [partial("a"), partial("  ")]),
    ("(^b)", True, [partial("a")]),
    ("(?m)^b", True, [partial("a"), partial("a\n")]),
    ("x|^b", True, [partial("a")]),
    (r"(?<=x)a", True, [partial("b"), partial(""), partial("xb")]),
    (r"\ba", True, [partial("b"), partial("!")]),
    (r"\b</a>", True, [partial("y"), partial("!"), partial("ab </")]),
    (r"\b\w", True, [partial("y!", 2)]),
    (r"\b.", True, [partial("y!", 2), partial("!")]),
    (r"(?<=x).", False, [partial("y")]),
    (r"(?<=x)", True, [partial("y")]),
    (r"\bx?", True, [partial("!")]),
    (r"(?<=x)a?", True, [partial("y")]),
    (r"(?!)a", True, [partial("b")]),
    ("(?=b)a", True, [partial("b")]),
    (r"\Bx", True, [partial("a"), partial("")]),
    ("(?:^|\n)x", True, [partial("a")]),
    ("(?<=a)|x", True, [partial("b")]),
    ("b|(?<=a)x", True, [partial("c")]),
    (r"(?<=a)(x)", True, [partial("c")]),
    (r"\b(x)", True, [partial("c")]),
    ("(?=\\s*\\{)x", True, [partial(" "), partial("a \n")]),
    ("(?=\\s*\\{)\\s", True, [partial(" ")]),
    ("(?=a*b)", True, [partial("aa")]),
    ("x(?=a*b)", True, [partial("xaa")]),
    # Lazy repeats before a literal: the module's look-ahead decides where the partial match starts.
    ("a*?b", True, [partial("aac"), partial("aa"), partial("xc"), partial("xcc")]),
    ("za*?b", True, [partial("zxc"), partial("zaa")]),
    ("za*?bc", True, [partial("zxc"), partial("zxcd")]),
    ("x.*?ab", False, [partial("xc\ndab"), partial("xc\nd"), partial("xcdab"), partial("xcd")]),
    ("x[^d]*?ab", True, [partial("xcdef"), partial("xcdab"), partial("xcd")]),
    ("x.{0,2}?ab", True, [partial("xcdefg"), partial("xcd")]),
    ("xy*?ab", True, [partial("xz"), partial("xyz"), partial("x"), partial("xya"), partial("xyab")]),
    ("xy+?ab", True, [partial("xz"), partial("xyz")]),
    ("xy{2,}?ab", True, [partial("xyz"), partial("xyyz")]),
    ("(.*?)ab", True, [partial("cd"), partial("c\nd"), partial("xcda")]),
    ("(.*?)b", False, [partial("c\nd"), partial("cdef")]),
    (r"x(a*?)(?:b|c)", True, [partial("xaa"), partial("xad")]),
    (r"x(a*?)(?:bc|bd)", True, [partial("xaa"), partial("xab")]),
    (r"x(a*?)(?:b|c|de)", True, [partial("xaa")]),
    (r"x(a*?)\s*b", True, [partial("xaa"), partial("xad")]),
    (r"x(a*?)\d+", True, [partial("xaa"), partial("xad")]),
    (r"x(a*?)(b)", True, [partial("xaa"), partial("xad"), partial("x")]),
    (r"x(a*?)(?=b)", True, [partial("xaa")]),
    (r"x(a*?)ab", True, [partial("xa"), partial("xaa")]),
    (r"x(a*?)$", True, [partial("xaa"), partial("xad")]),
    (r"\s*?<x>", True, [partial("qqq"), partial("qq<x")]),
    (r"[\s\S]*?<x>", True, [partial("qqq")]),
    (r"([\s\S]*?)<ab>", True, [partial("")]),
    (r"([\s\S]*?)<(?:<\|e\|>|<)", False, [partial("<ab></a><")]),
    (r"(?P<v>.*?)<\|e\|>", False, [partial("\n")]),
    # Search plan details: where the module looks for a first character.
    ("(?:^(?:<a>|ab)){1,2}", False, [partial(",y>a\n</a")]),
    (r"\s*a", False, [search(" " * 50 + "b"), partial(" " * 50)]),
]

# Patterns that must not compile: the module's syntax errors.
PYTHON_ERRORS = [
    r"\q", r"\e", r"[\q]", r"\c", r"(", ")", "a|*", "*a", "+", "?", "(?", "a**", "a{2}{3}", "a*?+", "a{2,1}",
    "[z-a]", "[a--b]", "[]", "[^]", r"(a)\2", r"\11", r"\8", r"\x4", r"\U00110000", "(?P<1a>x)", "(?P<a-b>x)",
    "(?P<>x)", r"(a\1)", r"(?P<n>a|(?P=n))", r"(?P<n>a)(?P=m)", r"\g<x>", r"\g<9>", "(?i-i)a", "(?-)a",
    "(?s-s:.)", "(?i)*", "(?#x)*", "(?Q)", r"[\8]", r"[\z]", r"\\" + "\\", "\\", r"\p{IsL}", "(?(1)a|b)", "(?1)",
]

# Patterns the module accepts that PythonRegex refuses: the error must name the construct.
UNSUPPORTED = [
    r"\G", r"\K", r"\X", r"\m", r"\M", r"\h", r"\R", r"\N{LATIN SMALL LETTER A}", r"\p{Han}",
    r"\p{Letter}", r"[[:alpha:]]", "(?x) a b", "(?a)\\w", "(?L)a", "(?V1)a", "(?f)a", "(?w)\\b", "(?r)a", "(?b)a",
    "(?e)a", "(?p)a", "a{e<=1}", "(?:ab){e<=1}", "(a)(?(1)b|c)", "(?R)", "(a)(?1)",
    "(?|a|b)", "(*PRUNE)", "(*FAIL)", "(?&n)(?<n>a)", "(?P>n)(?<n>a)", "(?i)\\p{Lu}", r"(?i)[\p{Ll}]",
]

LITERALS = ["a b\n\t", "<|im_end|>", "{x}.é", "\u2028\x1c\x00", "#&~-", "[TOOL_CALLS]", "日本"]

# Cases PythonRegex answers otherwise, with the difference the Swift test allows.
#   "none_or_empty_partial_at_end": a partial search that finds nothing is None in one engine and an empty partial
#       match at the end of the text in the other (the module decides by the optimisations of its search for a
#       starting character; both mean "nothing pending").
#   "groups_of_partial": same span and flag, different group spans (groups of partial matches are not used by
#       transformers).
#   "module_bug": the module's answer is impossible (a span that ends before it starts, an empty match of `.+?`).
#   "empty_iteration_groups": a group inside a bounded repeat whose body may match empty keeps another iteration's
#       span.
DIVERGENCES = [
    ("$\\A", True, partial("a<|e|", 2), "none_or_empty_partial_at_end"),
    ("(?m)^\\b", True, partial(""), "none_or_empty_partial_at_end"),
    ("\\Z\\Ax?\\s*", False, partial("["), "none_or_empty_partial_at_end"),
    ("(?<=\\n)(?=<)", True, partial("```j"), "none_or_empty_partial_at_end"),
    ("^(?<=\\n)```j", True, partial("", 1), "none_or_empty_partial_at_end"),
    (".\\[T\\]", True, partial("{\n><f=  ", 8), "none_or_empty_partial_at_end"),
    ("(?:(?P<v>.*?)\\s+){1,2}\\b<a>", True, partial("ab"), "groups_of_partial"),
    (".+?", True, partial("y ab<", 5), "module_bug"),
    (".+?\\b", True, partial("<ab", 3), "module_bug"),
    ("(a??){1,2}$", False, search("a"), "empty_iteration_groups"),
    ("(>??){1,2}\\B", False, finditer("<> "), "empty_iteration_groups"),
]


def span(m):
    return None if m is None else {"span": list(m.span()), "partial": bool(m.partial),
                                   "groups": [None if r == (-1, -1) else list(r) for r in m.regs[1:]]}


def answer(compiled, case):
    op = case["op"]
    if op == "search":
        return span(compiled.search(case["text"], case["pos"], partial=case["partial"]))
    if op == "fullmatch":
        return span(compiled.fullmatch(case["text"]))
    if op == "finditer":
        return [span(m) for m in compiled.finditer(case["text"], case["pos"])]
    try:
        return {"text": compiled.sub(case["template"], case["text"])}
    except (regex.error, IndexError) as e:
        return {"error": str(e)}


def compile_pattern(pattern, dotall):
    return regex.compile(pattern, regex.DOTALL if dotall else 0)


def main():
    patterns = []
    for pattern, dotall, cases in PATTERNS:
        compiled = compile_pattern(pattern, dotall)
        patterns.append({
            "pattern": pattern, "dotall": dotall, "groups": compiled.groups, "groupindex": dict(compiled.groupindex),
            "cases": [dict(case, expected=answer(compiled, case)) for case in flat(cases)],
        })
    errors = []
    for pattern in PYTHON_ERRORS:
        try:
            regex.compile(pattern)
        except regex.error as e:
            errors.append({"pattern": pattern, "python_error": str(e)})
        else:
            raise SystemExit(f"{pattern!r} compiles in the regex module")
    for pattern in UNSUPPORTED:
        regex.compile(pattern)  # the module accepts every one of them: raises otherwise
    divergences = []
    for pattern, dotall, case, kind in DIVERGENCES:
        divergences.append({"pattern": pattern, "dotall": dotall, "kind": kind,
                            "case": dict(case, expected=answer(compile_pattern(pattern, dotall), case))})
    fixture = {
        "regex_version": regex.__version__,
        "patterns": patterns,
        "python_errors": errors,
        "unsupported": UNSUPPORTED,
        "escape": [{"literal": literal, "expected": regex.escape(literal)} for literal in LITERALS],
        "divergences": divergences,
    }
    # One line per list entry: small, and a changed answer shows as a changed line.
    lines = ["{"]
    for index, key in enumerate(sorted(fixture)):
        value = fixture[key]
        comma = "," if index < len(fixture) - 1 else ""
        if isinstance(value, list):
            lines.append(f"  {json.dumps(key)}: [")
            for position, item in enumerate(value):
                item_comma = "," if position < len(value) - 1 else ""
                lines.append("    " + json.dumps(item, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + item_comma)
            lines.append("  ]" + comma)
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}{comma}")
    lines.append("}")
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
