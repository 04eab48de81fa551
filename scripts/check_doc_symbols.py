#!/usr/bin/env python3
# Checks the "question -> files" table of docs/design.md against the code: every answer names at
# most 4 files, each given as `path/to/file` followed by the symbols (`name`, `Class::method`)
# defined in it, and each file must exist and define each of its symbols. The table is the rows
# between the markers <!-- question-files:begin --> and <!-- question-files:end -->: the first
# cell is the question, the second the answer; in the answer every inline-code span that names a
# file (it has a '/' and a source extension) starts a file, and the spans after it, up to the next
# file, are its symbols (arrows and words between them are for the reader).
#
# "Defined" is read from the source, comments and strings left out:
#   Class::method   a line with `Class::method(` whose parentheses are followed by a body ('{'
#                   before any ';': an out-of-line definition or a constructor), or, inside the
#                   braces of `class Class` / `struct Class`, `method(` after a return type and
#                   followed by a body (an inline member);
#   name            `class name`, `struct name`, `union name`, `enum [class] name` with a body, or
#                   `using name =`, or `name(` after a return type and followed by a body (a
#                   function defined in the file, not only declared); in a Python file `def name`
#                   or `class name`.
# Each failure is printed as `docs/design.md: question "...": path: symbol not defined` (or
# `path: no such file`, or `N files, at most 4`), and the exit status is 1; otherwise one summary
# line and 0. Argument: the repository root (default: this script's folder's parent). Standard
# library only.

import os
import re
import sys

DOC = "docs/design.md"
BEGIN, END = "<!-- question-files:begin -->", "<!-- question-files:end -->"
MAX_FILES = 4
SOURCE = re.compile(r"^[\w.+-]+(/[\w.+-]+)+\.(h|hpp|cpp|cc|cu|py|sh|cmake|txt|toml)$")
SYMBOL = re.compile(r"^[A-Za-z_]\w*(::~?[A-Za-z_]\w*)*$")
CODE_SPAN = re.compile(r"`([^`]+)`")
KEYWORDS = {"return", "else", "if", "while", "for", "switch", "case", "new", "delete", "throw", "co_return",
            "sizeof", "decltype", "do", "goto", "not", "and", "or"}


def table_rows(text):
    """Yields (line number, question, answer) of each row between the markers."""
    inside = False
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip() == BEGIN:
            inside = True
            continue
        if line.strip() == END:
            return
        if not inside or not line.lstrip().startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or set(cells[0]) <= set("-: ") or cells[0].lower() == "question":
            continue
        yield number, cells[0], "|".join(cells[1:])


def answer_pairs(answer):
    """The answer's (file, [symbols]) in order; a symbol before any file is an error."""
    pairs, errors = [], []
    for span in CODE_SPAN.findall(answer):
        span = span.strip()
        if SOURCE.match(span):
            pairs.append((span, []))
        elif not pairs:
            errors.append(f"`{span}` names no file before it")
        elif SYMBOL.match(span):
            pairs[-1][1].append(span)
        else:
            errors.append(f"`{span}` is neither a file nor a symbol")
    for path, symbols in pairs:
        if not symbols:
            errors.append(f"{path}: no symbol given")
    return pairs, errors


def strip_comments_and_strings(source):
    """C++ source with comments, string and character literals blanked out (newlines kept)."""
    out, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            j = source.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif source.startswith("/*", i):
            j = source.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", source[i:j]))
            i = j
        elif source.startswith('R"', i) and (i == 0 or not (source[i - 1].isalnum() or source[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', source[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            close = ")" + m.group(1) + '"'
            j = source.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append(re.sub(r"[^\n]", " ", source[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and source[i - 1].isalnum() and i + 1 < n and source[i + 1].isalnum():
                out.append(" ")  # a digit separator (1'000)
                i += 1
                continue
            j = i + 1
            while j < n and source[j] != c and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", source[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def closing(text, start, open_char, close_char):
    """Index just past the bracket matching text[start] (an open_char); len(text) if none."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_char:
            depth += 1
        elif text[i] == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def has_body(text, open_paren):
    """Whether the parameter list opening at text[open_paren] is followed by a body: '{' comes
    (outside parentheses: a trailing return type, an initializer list) before ';' or '='."""
    i = closing(text, open_paren, "(", ")")
    depth = 0
    while i < len(text):
        c = text[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif depth == 0 and c == "{":
            return True
        elif depth == 0 and c in ";=":
            # `= default` is a definition; `= 0`, `= delete` and a declaration are not.
            return c == "=" and re.match(r"=\s*default\b", text[i:]) is not None
        i += 1
    return False


def after_return_type(text, at):
    """Whether the text before `at`, on its line, ends with a return type (or is a constructor's
    or destructor's own line start), not a call, an assignment or a keyword."""
    line_start = text.rfind("\n", 0, at) + 1
    before = text[line_start:at]
    if before.strip() == "" or before.rstrip().endswith("~"):
        return True  # a constructor or destructor, or a return type on the line above
    if re.search(r"[=.;,(){}!?+\-/%^|]|->", strip_angles(before)):
        return False
    words = re.findall(r"[A-Za-z_]\w*", before)
    if not words or words[0] in KEYWORDS or words[-1] in KEYWORDS:
        return False
    return re.search(r"[\w>*&:\]]\s*$", before) is not None


def strip_angles(s):
    """`s` with template arguments (<...>, nested) removed, so that their commas do not count."""
    prev = None
    while prev != s:
        prev = s
        s = re.sub(r"<[^<>]*>", "", s)
    return s


def defines_function(text, name, start=0, end=None):
    """Whether `name(`, after a return type and with a body, occurs in text[start:end]."""
    end = len(text) if end is None else end
    for m in re.finditer(r"(?<![\w:.>~])" + re.escape(name) + r"\s*\(", text[start:end]):
        at = start + m.start()
        open_paren = start + m.end() - 1
        if after_return_type(text, at) and has_body(text, open_paren):
            return True
    return False


def class_bodies(text, name):
    """(start, end) of the body of each `class name` / `struct name` / `union name` definition."""
    bodies = []
    for m in re.finditer(r"\b(class|struct|union)\s+" + re.escape(name) + r"\b[^;{()]*\{", text):
        open_brace = m.end() - 1
        bodies.append((open_brace, closing(text, open_brace, "{", "}")))
    return bodies


def defines(text, symbol, python):
    if python:
        name = symbol.split("::")[-1]
        return re.search(r"^\s*(def|class)\s+" + re.escape(name) + r"\b", text, re.M) is not None
    if "::" in symbol:
        owner, member = symbol.split("::")[-2], symbol.split("::")[-1]
        for m in re.finditer(re.escape(symbol) + r"\s*\(", text):
            if has_body(text, m.end() - 1):
                return True
        for start, end in class_bodies(text, owner):
            if defines_function(text, member, start + 1, end):
                return True
        return False
    if class_bodies(text, symbol):
        return True
    if re.search(r"\benum(\s+(class|struct))?\s+" + re.escape(symbol) + r"\b[^;{]*\{", text):
        return True
    if re.search(r"\busing\s+" + re.escape(symbol) + r"\s*=", text):
        return True
    return defines_function(text, symbol)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, DOC), encoding="utf-8") as f:
        rows = list(table_rows(f.read()))
    failures = []
    if not rows:
        failures.append(f"{DOC}: no question -> files table between {BEGIN} and {END}")
    sources, pairs_checked = {}, 0
    for _, question, answer in rows:
        where = f'{DOC}: question "{question}"'
        pairs, errors = answer_pairs(answer)
        failures += [f"{where}: {e}" for e in errors]
        files = list(dict.fromkeys(path for path, _ in pairs))
        if not files:
            failures.append(f"{where}: names no file")
        if len(files) > MAX_FILES:
            failures.append(f"{where}: {len(files)} files, at most {MAX_FILES}")
        for path, symbols in pairs:
            full = os.path.join(root, path)
            if not os.path.isfile(full):
                failures.append(f"{where}: {path}: no such file")
                continue
            if path not in sources:
                with open(full, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                python = path.endswith(".py")
                sources[path] = (text if python else strip_comments_and_strings(text), python)
            text, python = sources[path]
            for symbol in symbols:
                pairs_checked += 1
                if not defines(text, symbol, python):
                    failures.append(f"{where}: {path}: {symbol} not defined")
    for line in failures:
        print(line)
    if failures:
        return 1
    print(f"check_doc_symbols: {len(rows)} questions, {pairs_checked} symbols in {len(sources)} files, each defined "
          f"where {DOC} says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
