#!/usr/bin/python3
"""Checks that an HTML file is well-formed: every element closed in order (void elements
and self-closed SVG elements aside), one <html>, no reference to the network.
Usage: check_html.py FILE [MIN_HEATMAPS]"""
import sys
from html.parser import HTMLParser

VOID = {"meta", "br", "img", "input", "hr", "link"}


class Checker(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.heatmaps, self.html = [], [], 0, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "html":
            self.html += 1
        if tag == "svg" and a.get("class") == "heatmap":
            self.heatmaps += 1
        for k in ("src", "href"):
            if a.get(k, "").startswith(("http:", "https:", "//")):
                self.errors.append(f"network reference {a[k]}")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else 'nothing'}> at {self.getpos()}")
        else:
            self.stack.pop()


c = Checker()
c.feed(open(sys.argv[1], encoding="utf-8").read())
c.close()
if c.stack:
    c.errors.append(f"unclosed: {c.stack}")
if c.html != 1:
    c.errors.append(f"{c.html} <html> elements")
need = int(sys.argv[2]) if len(sys.argv) > 2 else 0
if c.heatmaps != need:
    c.errors.append(f"{c.heatmaps} heatmaps, expected {need}")
print(f"{sys.argv[1]}: {c.heatmaps} heatmaps, {len(c.errors)} problems")
for e in c.errors[:10]:
    print("  " + e)
sys.exit(1 if c.errors else 0)
