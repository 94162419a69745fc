#!/usr/bin/env python3
"""Writes tests/model/pretok_vectors.h: how each pre-tokenizer family splits a set of texts.

Oracle: the Python `regex` module (PyPI `regex` 2026.5.9), which implements Unicode
properties itself, independently of PCRE2. The patterns are the pre_tokenizer regexes of the
families' published tokenizer.json files (with their original (?i:...) groups), applied as
Hugging Face's Sequence of Split(behavior="Isolated") does: each pattern cuts every piece the
previous one left into matches and the text between them. This script is the generator; the
header it writes is committed. Run: python3 tests/model/gen_pretok_vectors.py > tests/model/pretok_vectors.h
"""
import sys

import regex

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
UP = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
LO = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
C = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
GPT4O = (r"[^\r\n\p{L}\p{N}]?" + UP + "*" + LO + "+" + C + "?|" +
         r"[^\r\n\p{L}\p{N}]?" + UP + "+" + LO + "*" + C + "?|" +
         r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
# DeepSeek LLM's letter class (code points of the published tokenizer.json class)
DS_LETTERS = ("A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
              "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
              "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
              "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
              "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
              "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
              "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
              "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
              "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
              "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
              "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
              "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
              "\U000118a0-\U000118df\U0001e900-\U0001e943")
BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
TEKKEN = (r"[^\r\n\p{L}\p{N}]?" + r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|" +
          r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|" +
          r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

FAMILIES = {
    "gpt-2": [GPT2],
    "llama-bpe": [LLAMA3],
    "qwen2": [QWEN2],
    "gpt-4o": [GPT4O],
    "starcoder": [r"\p{N}", GPT2],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK, r"\p{N}"],
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "deepseek-llm": [r"[\r\n]", r"\s?[" + DS_LETTERS + "]+",
                     "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+", r"\s+\Z", CJK,
                     r"\p{N}+"],
    "deepseek-v3": [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
                    r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "tekken": [TEKKEN],
    "bloom": [BLOOM],
    "viking": [BLOOM, r"\p{N}"],
    "chameleon": [r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}",
                  r"[\p{P}!-/:-@\[-`{-~]", GPT2],
    "seed-coder": [r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|"
                   r"\s*[\r\n]+|\s+(?!\S)|\s+"],
    "bailingmoe": [r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|"
                   r"\s*[\r\n]|\s+(?!\S)|\s+"],
}

TEXTS = [
    "Hello world",
    "I'M here, you'RE there; they'll've DON'T",
    "1234567 89 0",
    "HelloWorld's camelCaseText XMLHttpRequest",
    "   leading and trailing   ",
    "line one\nline two\r\n\r\nthree\n\n\n",
    "tab\tseparated\t\tvalues",
    "x/y\n\n/z",
    "price: $42.50 (approx.) -- ok?!",
    "\u4f60\u597d\u4e16\u754c hello \uc548\ub155\ud558\uc138\uc694",
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440 \u0393\u03b5\u03b9\u03ac",
    "emoji \U0001f600\U0001f680 and \u2603 snow",
    "caf\u00e9 na\u0308ive \u00c5ngstr\u00f6m",
    "a  b   c    d",
    "   \n  \n",
    "<|im_start|>user\nhi<|im_end|>",
    "3.14159e10 and 1,000,000",
    "\u0627\u0644\u0633\u0644\u0627\u0645 \u0639\u0644\u064a\u0643\u0645",
    "\u3053\u3093\u306b\u3061\u306f\u30ab\u30bf\u30ab\u30ca\u6f22\u5b57 ok",
    "\u2126hm \u212aelvin \u1f7d\u1fbe \u0390 \U00010400\U00010428 \U0001e900",
    "Hello\uff0c\u4e16\u754c\u3002 \u201cquoted\u201d\u2026 done.",
    "trailing spaces   ",
    "<sentinel:12> IMGIMGABZ x",
]


def split(patterns, text):
    pieces = [text]
    for p in patterns:
        rx = regex.compile(p)
        out = []
        for piece in pieces:
            done = 0
            for m in rx.finditer(piece):
                if m.end() == m.start():
                    continue
                if m.start() > done:
                    out.append(piece[done:m.start()])
                out.append(m.group(0))
                done = m.end()
            if done < len(piece):
                out.append(piece[done:])
        pieces = out
    return pieces


def c_string(s):
    b = s.encode("utf-8")
    out = []
    for ch in b:
        if ch == 0x5C:
            out.append("\\\\")
        elif ch == 0x22:
            out.append('\\"')
        elif 0x20 <= ch < 0x7F:
            out.append(chr(ch))
        else:
            out.append('\\x%02X""' % ch)
    return '"' + "".join(out) + '"'


def main():
    w = sys.stdout.write
    w("/* Generated by tests/model/gen_pretok_vectors.py (oracle: Python regex 2026.5.9); do not edit. */\n")
    w("static const char *const PRETOK_TEXTS[] = {\n")
    for t in TEXTS:
        w("    %s,\n" % c_string(t))
    w("};\n\n")
    w("typedef struct pretok_case {\n    const char *pre;\n    int text;\n    int n;\n"
      "    int len[64]; /* byte lengths of the pieces */\n} pretok_case;\n\n")
    w("static const pretok_case PRETOK_CASES[] = {\n")
    for name, pats in FAMILIES.items():
        for i, t in enumerate(TEXTS):
            pieces = split(pats, t)
            assert "".join(pieces) == t and len(pieces) <= 64
            lens = ", ".join(str(len(p.encode("utf-8"))) for p in pieces)
            w('    {"%s", %d, %d, {%s}},\n' % (name, i, len(pieces), lens))
    w("};\n")


if __name__ == "__main__":
    main()
