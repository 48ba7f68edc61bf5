#!/usr/bin/env python3
"""Makes data/austen-chat.jsonl and data/austen-chat-val.jsonl, the shipped chat corpus, from
data/austen.jsonl (Jane Austen's six novels, public domain): conversations in MiniMind's SFT
format about the novels' text, their titles, years and characters. Deterministic: the same
files on every machine (checked by their sha256 in data/README.md).

Kinds of conversation, each answer derived from the text or from the facts below:
  which novel a passage is from; the sentence that follows one; both in two turns; who wrote a
  novel and when it was published; a character of a novel; whether a line is a question; how
  many words a line has; greetings. About one in five starts with a system prompt.
Records of the source are split by index: every tenth record's passages are held out for the
validation file, so no passage of it is seen in training.

Usage: python3 scripts/make_chat_corpus.py [SOURCE.jsonl OUT_DIR]
"""
import hashlib
import json
import os
import re
import sys

TITLES = ["Emma", "Mansfield Park", "Northanger Abbey", "Persuasion", "Pride and Prejudice",
          "Sense and Sensibility"]
# First publication (Northanger Abbey and Persuasion appeared together after her death).
YEARS = {"Sense and Sensibility": 1811, "Pride and Prejudice": 1813, "Mansfield Park": 1814,
         "Emma": 1815, "Northanger Abbey": 1817, "Persuasion": 1817}
CHARACTERS = {
    "Emma": ["Emma Woodhouse", "Mr. Knightley", "Harriet Smith", "Frank Churchill",
             "Jane Fairfax", "Mr. Elton", "Miss Bates"],
    "Mansfield Park": ["Fanny Price", "Edmund Bertram", "Henry Crawford", "Mary Crawford",
                       "Sir Thomas Bertram", "Mrs. Norris"],
    "Northanger Abbey": ["Catherine Morland", "Henry Tilney", "Eleanor Tilney",
                         "Isabella Thorpe", "John Thorpe", "General Tilney"],
    "Persuasion": ["Anne Elliot", "Captain Wentworth", "Sir Walter Elliot", "Lady Russell",
                   "Louisa Musgrove", "Mrs. Smith"],
    "Pride and Prejudice": ["Elizabeth Bennet", "Mr. Darcy", "Jane Bennet", "Mr. Bingley",
                            "Mr. Wickham", "Lydia Bennet", "Mr. Collins"],
    "Sense and Sensibility": ["Elinor Dashwood", "Marianne Dashwood", "Edward Ferrars",
                              "Colonel Brandon", "John Willoughby", "Lucy Steele"],
}
SYSTEMS = ["You are a guide to the novels of Jane Austen. Answer briefly.",
           "You are a helpful assistant who knows Jane Austen's books well.",
           "Answer in one short sentence."]
GREETINGS = [("Hello", "Hello! Ask me about Jane Austen's novels."),
             ("Hi", "Hi! I can tell you about Jane Austen's six novels."),
             ("Good morning", "Good morning! What would you like to know about Jane Austen?"),
             ("Who are you?", "I am a small language model trained on Jane Austen's novels."),
             ("Thank you", "You are welcome.")]


def draw(*parts):
    """A number in [0, 2^64) from a hash of the parts: the same on every machine."""
    h = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "little")


def sentences(text):
    """The sentences of a record, each 20 to 240 characters, without chapter headings."""
    out = []
    for para in text.split("\n"):
        if para.isupper() or para.startswith("CHAPTER") or len(para) < 20:
            continue
        for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", para):
            s = s.strip()
            if 20 <= len(s) <= 240:
                out.append(s)
    return out


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def conversations(index, title, sents):
    """The conversations made from record `index` of novel `title`."""
    out = []
    for k in range(0, len(sents) - 1, 4):
        s, nxt = sents[k], sents[k + 1]
        kind = draw(index, k, "kind") % 7
        if kind == 0:
            conv = [user(f"Which of Jane Austen's novels is this passage from?\n\n{s}"),
                    assistant(f"This passage is from {title}.")]
        elif kind == 1:
            conv = [user(f"Continue this passage from {title}:\n\n{s}"), assistant(nxt)]
        elif kind == 2:
            conv = [user(f"Which of Jane Austen's novels is this passage from?\n\n{s}"),
                    assistant(f"This passage is from {title}."),
                    user("What comes next?"), assistant(nxt)]
        elif kind == 3:
            words = len(s.split())
            conv = [user(f"How many words are in this line?\n\n{s}"),
                    assistant(f"It has {words} words.")]
        elif kind == 4:
            question = s.endswith("?")
            conv = [user(f"Is this line a question?\n\n{s}"),
                    assistant("Yes, it is a question." if question else "No, it is not a question.")]
        elif kind == 5:
            names = CHARACTERS[title]
            name = names[draw(index, k, "name") % len(names)]
            conv = [user(f"Name a character in {title}."), assistant(f"{name} is a character in {title}.")]
        else:
            if draw(index, k, "fact") % 2:
                conv = [user(f"Who wrote {title}?"), assistant(f"Jane Austen wrote {title}.")]
            else:
                conv = [user(f"When was {title} first published?"),
                        assistant(f"{title} was first published in {YEARS[title]}.")]
        if draw(index, k, "greet") % 12 == 0:
            hello, reply = GREETINGS[draw(index, k, "which greeting") % len(GREETINGS)]
            conv = [user(hello), assistant(reply)] + conv
        if draw(index, k, "system") % 5 == 0:
            conv = [{"role": "system", "content": SYSTEMS[draw(index, k, "which") % len(SYSTEMS)]}] + conv
        out.append({"conversations": conv})
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    source = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "data", "austen.jsonl")
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "data")
    train, val = [], []
    title = None
    for index, line in enumerate(open(source, encoding="utf-8")):
        text = json.loads(line)["text"]
        first = text.split("\n", 1)[0].strip().title().replace(" And ", " and ")
        if first in TITLES:
            title = first
        if title is None:
            continue
        convs = conversations(index, title, sentences(text))
        (val if index % 10 == 9 else train).extend(convs)
    for name, convs in (("austen-chat.jsonl", train), ("austen-chat-val.jsonl", val)):
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            for c in convs:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
        print(f"{name}: {len(convs)} conversations")


if __name__ == "__main__":
    main()
