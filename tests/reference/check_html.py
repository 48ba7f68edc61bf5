#!/usr/bin/python3
"""Checks that an HTML file is well-formed: every element closed in order (void elements
and self-closed SVG elements aside), one <html>, no reference to the network; and that in
every inline SVG no two text labels overlap and none sticks out of the picture (label
widths estimated at 0.6 em per character, generous for the sans-serif the report uses).
Usage: check_html.py FILE [MIN_HEATMAPS]"""
import sys
from html.parser import HTMLParser

VOID = {"meta", "br", "img", "input", "hr", "link"}


class Checker(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.heatmaps, self.html = [], [], 0, 0
        self.svg, self.text, self.labels = None, None, 0  # the SVG being read, its open <text>

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "html":
            self.html += 1
        if tag == "svg" and a.get("class") == "heatmap":
            self.heatmaps += 1
        if tag == "svg":
            self.svg = {"w": float(a["width"]), "h": float(a["height"]), "boxes": []}
        if tag == "text" and self.svg is not None:
            size = {"title": 13, "tick": 10, "legend": 10}.get(a.get("class"), 12)
            self.text = (float(a["x"]), float(a["y"]), a.get("text-anchor", "start"), size, "")
        for k in ("src", "href"):
            if a.get(k, "").startswith(("http:", "https:", "//")):
                self.errors.append(f"network reference {a[k]}")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.stack.pop()

    def handle_data(self, data):
        if self.text is not None:
            self.text = self.text[:4] + (self.text[4] + data,)

    def end_text(self):
        x, y, anchor, size, content = self.text
        self.text = None
        width = 0.6 * size * len(content)
        x0 = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
        box = (x0, y - 0.8 * size, x0 + width, y + 0.2 * size, content)
        self.labels += 1
        if box[0] < -1 or box[2] > self.svg["w"] + 1 or box[1] < -1 or box[3] > self.svg["h"] + 1:
            self.errors.append(f"label {content!r} sticks out of its picture at {self.getpos()}")
        for other in self.svg["boxes"]:
            if box[0] < other[2] - 1 and other[0] < box[2] - 1 and box[1] < other[3] - 1 and other[1] < box[3] - 1:
                self.errors.append(f"labels {other[4]!r} and {content!r} overlap at {self.getpos()}")
        self.svg["boxes"].append(box)

    def handle_endtag(self, tag):
        if tag == "text" and self.text is not None:
            self.end_text()
        if tag == "svg":
            self.svg = None
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
print(f"{sys.argv[1]}: {c.heatmaps} heatmaps, {c.labels} labels, {len(c.errors)} problems")
for e in c.errors[:10]:
    print("  " + e)
sys.exit(1 if c.errors else 0)
