#!/usr/bin/python3
"""test_reserved_words.py DMC SOURCE_ROOT: every reserved word is listed in
docs/language.md and refused as a name with an error that says so.

The reserved words are the keywords frontend/lexer.l returns as tokens (its
`"word" { return token(STATE, KW_...); }` rules). The test checks that
  - docs/language.md's "Reserved words (keywords):" list is exactly that set;
  - for each word W, `dmc --check` of a program that names a parameter W, and one that
    defines a value `W = ...` at the start of a line, exits 1 with
    "'W' is a reserved word" in its one error;
  - likewise, every built-in function of docs/language.md's "Expressions" table
    (`relu(x)`, `softmax(x)`, ...) cannot name a layer (a call by that name would always
    call the function): "'F' is a built-in function" is the one error.
Exit status: 0 pass, 1 failure.
"""
import os
import re
import subprocess
import sys
import tempfile


def lexer_keywords(root):
    text = open(os.path.join(root, "frontend", "lexer.l")).read()
    return set(re.findall(r'^"([a-z]+)"\s+\{ return token\(STATE, KW_', text, re.M))


def documented(root):
    text = open(os.path.join(root, "docs", "language.md")).read()
    m = re.search(r"Reserved words \(keywords\): `([^`]*)`", text)
    return set(m.group(1).split()) if m else set()


def documented_functions(root):
    """The functions the "Expressions" table's first column calls: `relu(x)`, ..."""
    text = open(os.path.join(root, "docs", "language.md")).read()
    section = text.split("## Expressions")[1].split("\n## ")[0]
    names = set()
    for row in section.splitlines():
        if row.startswith("| `"):
            names |= set(re.findall(r"`([a-z_]+)\(", row.split(" | ")[0]))
    return names


def check(dmc, tmp, word, program, said="'%s' is a reserved word"):
    path = os.path.join(tmp, "reserved.dm")
    with open(path, "w") as f:
        f.write(program)
    r = subprocess.run([dmc, "--check", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True, timeout=60)
    errors = [line for line in r.stderr.splitlines() if ": error: " in line]
    if r.returncode != 1 or len(errors) != 1 or (said % word) not in errors[0]:
        return ["%r: exit %d, stderr:\n%s" % (program, r.returncode, r.stderr)]
    return []


def main(argv):
    dmc, root = argv[1], argv[2]
    words = lexer_keywords(root)
    failures = []
    if len(words) < 10:
        failures.append("found only %d keywords in frontend/lexer.l: %s" % (len(words), sorted(words)))
    docs = documented(root)
    if docs != words:
        failures.append("docs/language.md lists %s; the lexer reserves %s (missing from the docs: %s; not reserved: %s)"
                        % (sorted(docs), sorted(words), sorted(words - docs), sorted(docs - words)))
    tail = "input x : f32[4]\nparam w : f32[4] = zeros\nloss = mean(x * w)\nminimize loss\noptimizer sgd()\n"
    with tempfile.TemporaryDirectory(prefix="dmc-reserved-") as tmp:
        for word in sorted(words):
            failures += check(dmc, tmp, word, "param %s : f32[4] = zeros\n" % word + tail)
            failures += check(dmc, tmp, word, "%s = relu(w)\n" % word + tail)
        functions = documented_functions(root)
        if len(functions) < 20:
            failures.append("found only %d functions in docs/language.md's Expressions table: %s"
                            % (len(functions), sorted(functions)))
        for name in sorted(functions):
            failures += check(dmc, tmp, name, "block b(x) {\n    return x\n}\nlayer %s = b\n" % name + tail,
                              "'%s' is a built-in function and cannot name a layer")
    for f in failures:
        print("FAIL " + f)
    print("%d reserved words: %s" % (len(words), " ".join(sorted(words))))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
