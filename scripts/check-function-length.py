#!/usr/bin/env python3
"""Lists C++ functions longer than a limit (default 80 lines) in framework/, apps/, python/ and
adapters/.

A brace-matching heuristic, not a parser: comments, string and character literals and
preprocessor lines are blanked out, then every `{` at namespace or class scope is classified
by the text in front of it. A `{` after `)` (optionally followed by const, noexcept,
override, a trailing return type or a constructor's initializer list) opens a function body;
one after `=` or a name (brace-initialized data: tables) does not, so tables are never
counted. Generated files (*.in templates, anything under a build directory or marked
"generated") are skipped. A function's length runs from the line of its `{`'s statement start
to its closing `}`.

Usage: check-function-length.py [--max N] [--allow FILE] [ROOT]
Exit status 1 when a function outside the allowlist is over the limit.
"""

import argparse
import os
import re
import sys

SCAN_DIRS = ("framework", "apps", "python", "adapters")
EXTENSIONS = (".cc", ".h", ".cpp", ".hpp")
# Files that are not ours to split yet; the ctest passes this list, remove entries as their
# owners split them.
DEFAULT_ALLOW = ()

CONTROL = re.compile(r"\b(if|for|while|switch|catch|do|else|try)\s*(\(|$)")
# What may follow a function's closing `)` before its body.
AFTER_PARAMS = re.compile(
    r"\)\s*(?:const|volatile|noexcept(?:\s*\([^()]*\))?|override|final|mutable|&|&&|\s)*"
    r"(?:->\s*[\w:<>,\s*&\[\]]+)?\s*$"
)


def blank_out(text):
    """Replaces comments, literals and preprocessor lines with spaces, keeping newlines."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":
            # A preprocessor line, with its continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        line_start = False
        if c == "\n":
            line_start = True
            out.append(c)
            i += 1
        elif text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == "R" and i + 1 < n and text[i + 1] == '"' and not (
            i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            open_paren = text.find("(", i + 2)
            delim = text[i + 2 : open_paren]
            end = text.find(")" + delim + '"', open_paren)
            end = n if end < 0 else end + len(delim) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():
                # A digit separator (1'000), not a character literal.
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def classify(segment):
    """What a `{` at namespace/class scope opens, given the statement text in front of it."""
    s = " ".join(segment.split())
    if not s:
        return "other"
    if re.search(r"\bnamespace\b", s) or re.search(r'\bextern\s*"', s) or s.startswith("extern"):
        return "scope"
    if re.search(r"\b(class|struct|union)\b[^()=]*$", s) and not re.search(r"\benum\b", s):
        return "scope"
    if re.search(r"\benum\b", s):
        return "other"
    # A lambda at namespace scope (`auto f = [](int x) {`) is a function too.
    if re.search(r"=\s*\[[^\]]*\]\s*(\([^()]*\))?[^=]*$", s) and AFTER_PARAMS.search(s):
        return "function"
    if "=" in s.replace("==", "").replace("operator=", "").replace("<=", "").replace(">=", ""):
        # `= {` tables; `operator==(...) {` and default arguments are handled above/below.
        if not re.search(r"\boperator\s*\S*\s*\(", s) and not re.search(r"\)\s*$", s):
            return "other"
    if CONTROL.search(s):
        return "other"
    if AFTER_PARAMS.search(s) and "(" in s:
        return "function"
    # A constructor whose initializer list ends in a braced member init: `: a_(x), b_{y} {`.
    if re.search(r"\)\s*:\s*[\w:]+\s*[({]", s) and re.search(r"[)}]\s*$", s):
        return "function"
    return "other"


def functions(path):
    """Yields (name, first_line, last_line) for each function body at namespace/class scope."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = blank_out(f.read())
    stack = []  # kinds of the open braces
    segment_start = 0  # where the current statement began
    in_function = 0  # depth of function braces, 0 outside any function
    func_start = None
    i = 0
    for i, c in enumerate(text):
        if in_function:
            if c == "{":
                in_function += 1
            elif c == "}":
                in_function -= 1
                if in_function == 0:
                    yield func_start[0], func_start[1], text.count("\n", 0, i) + 1
                    segment_start = i + 1
            continue
        if c == ";":
            segment_start = i + 1
        elif c == "{":
            segment = text[segment_start:i]
            kind = classify(segment)
            if kind == "function":
                offset = len(segment) - len(segment.lstrip())
                first = text.count("\n", 0, segment_start + offset) + 1
                flat = " ".join(segment.split())
                lambda_var = re.search(r"(\w+)\s*=\s*\[", flat)
                if lambda_var:
                    name = lambda_var.group(1)
                else:
                    name = (re.split(r"\(", flat)[0].split()[-1:] or ["?"])[0]
                func_start = (name, first)
                in_function = 1
            else:
                stack.append(kind)
                if kind == "scope":
                    segment_start = i + 1
        elif c == "}":
            kind = stack.pop() if stack else "scope"
            if kind == "scope":
                segment_start = i + 1
        elif c == ":" and stack and stack[-1] == "scope":
            # `public:` and friends end a statement in a class body.
            before = text[segment_start:i].split()
            if before and before[-1] in ("public", "private", "protected") and len(before) == 1:
                segment_start = i + 1


def is_generated(path):
    if path.endswith(".in") or "/build" in path:
        return True
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(400).lower()
    return "generated" in head and ("do not edit" in head or "@generated" in head)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(__file__), ".."))
    parser.add_argument("--max", type=int, default=80, help="longest allowed function, in lines")
    parser.add_argument("--allow", action="append", default=list(DEFAULT_ALLOW),
                        help="file (relative to ROOT) whose long functions are only reported")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    failed = False
    for top in SCAN_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("build"))
            for name in sorted(filenames):
                if not name.endswith(EXTENSIONS):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                if is_generated(path):
                    continue
                for func, first, last in functions(path):
                    length = last - first + 1
                    if length <= args.max:
                        continue
                    allowed = rel in args.allow
                    failed |= not allowed
                    note = " (allowlisted)" if allowed else ""
                    print(f"{rel}:{first}: {func} is {length} lines (max {args.max}){note}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
