#!/usr/bin/env python3
"""Reference outputs for hyflow's math_dapo and gsm8k scorers.

Reproduces the semantics of verl's verl/utils/reward_score/math_dapo.py and gsm8k.py (at the
commit hyflow tracks) with Python's own str and re, and writes reward_reference.json:
normalize_final_answer, is_correct_minerva, is_correct_strict_box and compute_score (both
modes) on a corpus of strings chosen to exercise code points, Unicode whitespace, Unicode
digits, case-insensitive matching and the regex rewrites.

Run: /usr/bin/python3 tests/algos/data/make_reward_reference.py  (from the repository root)
"""
import json
import os
import re
import sys
import unicodedata

# --- verl's normalisation tables (facts: the strings and their order) ---
SUBS = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
        (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}")]
REMOVE = ["square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
          "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
          "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
          "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
          ",\\!", "{,}", '"', "\\dots"]


def normalize(ans: str) -> str:
    ans = ans.split("=")[-1]
    for a, b in SUBS:
        ans = ans.replace(a, b)
    for e in REMOVE:
        ans = ans.replace(e, "")
    ans = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", ans)
    for word in ("text", "textbf", "overline"):
        ans = re.sub(r"(\\" + word + r"\{)(.*?)(\})", r"\2", ans)
    ans = re.sub(r"(\\boxed\{)(.*)(\})", r"\2", ans)
    ans = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", ans)
    ans = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", ans)
    ans = ans.replace("$", "")
    if ans.replace(",", "").isdigit():
        ans = ans.replace(",", "")
    return ans.strip()


def last_boxed(s):
    i = s.rfind("\\boxed{")
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(s)):
        depth += s[j] == "{"
        if s[j] == "}":
            depth -= 1
            if depth == 0:
                return s[i:j + 1]
    return None


def unbox(s):
    assert s.startswith("\\boxed{") and s.endswith("}")
    return s[len("\\boxed{"):-1]


def minerva(solution, gt, gt_need_extract=False):
    found = re.findall(r"(?i)Answer\s*:\s*([^\n]+)", solution)
    pred = normalize(found[-1] if found else "[INVALID]")
    target = normalize(unbox(last_boxed(gt))) if gt_need_extract else normalize(gt)
    return pred == target, pred


def strict_box(pred, gt, pause=None):
    pred = pred[pause[-1] - 100:] if pause is not None else pred[-100:]
    boxed = last_boxed(pred)
    got = unbox(boxed) if boxed is not None else None
    return (1 if got == gt else -1), got


def compute_score(solution, gt, strict=False, pause=None):
    solution = solution[-300:]
    if strict:
        score, pred = strict_box(solution, gt, pause)
        ok = score == 1
    else:
        ok, pred = minerva(solution, gt)
    return {"score": 1.0 if ok else -1.0, "acc": ok, "pred": pred}


def gsm8k_extract(solution, method):
    solution = solution[-300:]
    if method == "strict":
        found = re.findall(r"#### (\-?[0-9\.\,]+)", solution)
        return found[-1].replace(",", "").replace("$", "") if found else None
    found = re.findall(r"(\-?[0-9\.\,]+)", solution)
    if not found:
        return None
    final = None
    for final in reversed(found):
        if final not in ("", "."):
            break
    return final


NBSP, NNBSP, IDEO, EMSP, LS = "\u00a0", "\u202f", "\u3000", "\u2003", "\u2028"

NORMALIZE = [
    "\\fracπ2", "\\frac{π}{2}", "\\fracπ", "\\fracπ\n2", "\\frac\nπ", "\\frac{", "\\sqrtπ", "\\sqrt{π}",
    "\\sqrt", "\\sqrtπx", "x=\\fracαβγ", "\\frac12", "\\frac1{72}", "\\dfrac{1}{2}",
    "$\\frac{1}{2}$", "so $x$ and $y$", "a $b$ c\nd $e$ f", "$only one", "$ü$", "\\text{ü} and \\text{é}",
    "\\text{a\nb}", "\\text{a}\\text{b}", "\\textbf{ß}", "\\overline{ȳ}", "\\boxed{a}}\n\\boxed{b}}",
    "\\boxed{\\boxed{ø}}", "\\boxed{x", "\\text{\\text{a}}",
    NBSP + "42" + NBSP, NNBSP + "7" + IDEO, EMSP + "x" + LS, "\u0085" + "9" + "\u1680", "\x1c5\x1f",
    "\u200b7\u200b", "\ufeff7",
    "1,000", "١٢٣", "٣,٤", "²", "1,²", "①", "⁵", "١٢٣.٥", "12a", "", " ", ",", "0",
    "5 dollars", "\\text{5 dollars}", "90^\\circ", "x = \\boxed{10}", "The answer is $x^2$ here",
    "an apple", "a b", "\\$5", "\\mbox{cm}", "1,\\!000", "{,}", "5\\text{m}", "\\ldots", "3\\;4",
    "\"quoted\"", "ǅ", "Answer", "ſ", "ﬀ", "e\u0301", "\U0001d7ce\U0001d7cf",
]

SOLUTIONS = [
    "work...\nAnswer: 42", "answer: 41\nmore text", "Answer: 1\nAnswer: 2", "no final line",
    "ANSWER : 5", "AnſwEr: 6", "Anſwer:7", "answer :" + NBSP + "8", "Answer:" + NBSP + NBSP, "Answer:   ",
    "Answer:\n\n9", "Answer:" + LS + "10", "Answer:  \n", "Answer:\n", "Answer:", "xAnswer: 11yAnswer: 12",
    "Answer:Answer: 13", "Answer: \\fracπ2", "Answer: $\\frac{1}{2}$.", "Answer" + IDEO + ":" + IDEO + "14",
    "Answer\u0085:15", "Answer\t:\t16", "Answer: ١٢", "Answer: ٣,٤", "Answer: ①", "answer: x = 3",
    "The final answer: \\boxed{ø}", "Answer: 3\r\nmore", "Answer: a\rb", "ＡＮＳＷＥＲ: 17", "Answer: 18\u2029x",
    "ends with Answer: " + "9" * 290, "Answer: 1\n" + "filler " * 60 + "\nAnswer: 2",
]

STRICT = [
    "so \\boxed{42}", "so \\boxed{42.0}", "no box at all", "\\boxed{π}", "\\boxed{unbalanced",
    "\\boxed{1} then \\boxed{2}", "\\boxed{x}" + "." * 100, "é" * 95 + "\\boxed{3}", "\\boxed{ü}",
]


def main():
    out_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reward_reference.json")
    ref = {
        "python": sys.version.split()[0],
        "unicode": unicodedata.unidata_version,
        "normalize_final_answer": [[s, normalize(s)] for s in NORMALIZE],
        "minerva": [],
        "strict_box": [],
        "compute_score": [],
        "gsm8k": [],
    }
    for s in SOLUTIONS:
        for gt in ("42", "5", "π/2", "\\frac{π}{2}", "12"):
            ok, pred = minerva(s, gt)
            ref["minerva"].append({"solution": s, "gt": gt, "correct": ok, "pred": pred})
        ref["compute_score"].append({"solution": s, "gt": "42", "strict": False, **compute_score(s, "42")})
    for s in STRICT:
        for gt in ("42", "π", "3"):
            score, pred = strict_box(s, gt)
            ref["strict_box"].append({"solution": s, "gt": gt, "score": score, "pred": pred})
            ref["compute_score"].append({"solution": s, "gt": gt, "strict": True, **compute_score(s, gt, True)})
        for pause in ([0, 0, 0, 5], [0, 0, 0, 104], [0, 0, 0, 400]):
            score, pred = strict_box(s, "42", pause)
            ref["strict_box"].append({"solution": s, "gt": "42", "pause": pause, "score": score, "pred": pred})
    for s in ["#### 1,234", "#### 72 then #### -73.5", "I think 3 then 42", "5 and .", "it is 42.", ". .",
              "none", "#### ٣", "π #### 7", "#### 5" + " " * 400, "é" * 299 + "#### 8"]:
        for method in ("strict", "flexible"):
            ref["gsm8k"].append({"solution": s, "method": method, "answer": gsm8k_extract(s, method)})
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(ref, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
