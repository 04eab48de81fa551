#!/usr/bin/env python3
# Checks the links of the documentation: README.md and every docs/**/*.md of the repository this
# script is in (or of the root given as the only argument). Every Markdown link, `[text](target)`,
# `![alt](target)` or a reference definition `[label]: target`, and every href/src of inline HTML,
# whose target is relative (no scheme such as http:, https: or mailto:) must name a file or folder
# that exists, relative to the linking file; a `#anchor`, alone or after a Markdown file's path,
# must be a heading of that file as GitHub names it (lowercase, punctuation dropped except '-' and
# '_', spaces to '-', a repeated heading suffixed -1, -2, ...) or an explicit <a id/name="...">.
# Links inside fenced code blocks and inline code are not links. Each broken one is printed as
# `FILE:LINE: broken link TARGET (why)`, and the exit status is 1; otherwise one summary line and 0.
# Standard library only.

import os
import re
import sys
import unicodedata
from urllib.parse import unquote

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
REF_DEF = re.compile(r"^ {0,3}\[((?:[^\]\\]|\\.)+)\]:[ \t]*(<[^>]*>|\S+)", re.M)
HTML_ANCHOR = re.compile(r"<a\s[^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def blocks(text):
    """Yields (first line number, lines) of each run of non-blank lines outside fenced code."""
    fence = None
    run, start = [], 0
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip(" `~"):
                fence = None
            continue
        if m and not (m.group(1)[0] == "`" and "`" in line[m.end():]):
            if run:
                yield start, run
            run, fence = [], m.group(1)
            continue
        if line.strip():
            if not run:
                start = number
            run.append(line)
        elif run:
            yield start, run
            run = []
    if run:
        yield start, run


def mask_code_spans(text):
    """Blanks out inline code (the backticks too), keeping newlines so offsets keep their lines."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            out.append(text[i:i + 2])
            i += 2
            continue
        if text[i] != "`":
            out.append(text[i])
            i += 1
            continue
        j = i
        while j < len(text) and text[j] == "`":
            j += 1
        ticks = text[i:j]
        close = re.compile(r"(?<!`)" + ticks + r"(?!`)").search(text, j)
        if not close:
            out.append(ticks)
            i = j
            continue
        out.append(re.sub(r"[^\n]", " ", text[i:close.end()]))
        i = close.end()
    return "".join(out)


def heading_text(raw):
    """The text GitHub renders for a heading's Markdown, which is what it slugs."""
    t = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)  # links and images: their text
    t = re.sub(r"<[^>]+>", "", t)  # HTML tags
    t = re.sub(r"\\(.)", r"\1", t)  # backslash escapes
    return t.replace("`", "").replace("*", "").strip()


def slug(text):
    s = "".join(c for c in text.lower() if c in "-_ " or unicodedata.category(c)[0] in "LMN")
    return s.replace(" ", "-")


def anchors(text):
    """Every anchor a Markdown file defines: heading slugs (repeats numbered) and <a id/name>."""
    found, seen = set(), {}
    previous = None
    for _, lines in blocks(text):
        for k, line in enumerate(lines):
            m = ATX.match(line)
            raw = None
            if m:
                raw = m.group(2) or ""
            elif k > 0 and SETEXT.match(line) and previous is not None:
                raw = previous
            previous = None if m else line
            if raw is None:
                found.update(HTML_ANCHOR.findall(mask_code_spans(line)))
                continue
            base = slug(heading_text(raw))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else "%s-%d" % (base, n))
            found.update(HTML_ANCHOR.findall(raw))
        previous = None
    return found


def destination(text, i):
    """The link destination that starts at text[i] (just after '('), or None."""
    while i < len(text) and text[i] in " \t\n":
        i += 1
    if i < len(text) and text[i] == "<":
        end = text.find(">", i)
        return None if end < 0 else text[i + 1:end]
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c in " \t\n":
            break
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        j += 1
    return text[i:j] if j < len(text) else None


def links(text):
    """(line, target) of every link outside code."""
    for start, lines in blocks(text):
        block = mask_code_spans("\n".join(lines))
        line_of = lambda offset: start + block.count("\n", 0, offset)
        for m in re.finditer(r"\]\(", block):
            if "[" not in block[:m.start()] or (m.start() > 0 and block[m.start() - 1] == "\\"):
                continue
            target = destination(block, m.end())
            if target:
                yield line_of(m.start()), target
        for m in REF_DEF.finditer(block):
            yield line_of(m.start()), m.group(2).strip("<>")
        for m in HTML_LINK.finditer(block):
            yield line_of(m.start()), m.group(1)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))
    files = [os.path.join(root, "README.md")] if os.path.isfile(os.path.join(root, "README.md")) else []
    for folder, _, names in sorted(os.walk(os.path.join(root, "docs"))):
        files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".md")]
    texts, anchor_cache = {}, {}

    def read(path):
        if path not in texts:
            with open(path, encoding="utf-8") as f:
                texts[path] = f.read()
        return texts[path]

    def anchors_of(path):
        if path not in anchor_cache:
            anchor_cache[path] = anchors(read(path))
        return anchor_cache[path]

    broken, checked = [], 0
    for path in files:
        for line, target in links(read(path)):
            if SCHEME.match(target) or target.startswith("//"):
                continue  # http:, https:, mailto: and every other scheme: not ours to check
            checked += 1
            where = "%s:%d" % (os.path.relpath(path, root), line)
            file_part, _, fragment = target.partition("#")
            file_part = unquote(file_part.split("?", 1)[0])
            if file_part.startswith("/"):
                broken.append((where, target, "an absolute path; link relative to the file"))
                continue
            linked = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            if file_part and not os.path.exists(linked):
                broken.append((where, target, "no such file or folder: %s" % os.path.relpath(linked, root)))
                continue
            if not fragment or not linked.endswith(".md") or os.path.isdir(linked):
                continue  # a line anchor into source (#L10) and the like are GitHub's, not headings
            if unquote(fragment) not in anchors_of(linked):
                broken.append((where, target, "no heading or anchor '%s' in %s" %
                               (unquote(fragment), os.path.relpath(linked, root))))
    for where, target, why in broken:
        print("%s: broken link %s (%s)" % (where, target, why))
    if broken:
        return 1
    print("check_doc_links: %d links in %d files, all resolve" % (checked, len(files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
