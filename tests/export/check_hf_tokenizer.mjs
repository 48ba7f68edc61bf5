// Encodes texts with Hugging Face's tokenizers (npm @huggingface/tokenizers, pure
// JavaScript) from a tokenizer.json, for the export tests to compare with our ids.
// Usage: node check_hf_tokenizer.mjs DIR TEXTS.json   (DIR holds tokenizer.json and
// tokenizer_config.json). Prints {"ids": [[...] per text]}, [bos] included.
import fs from "node:fs";
import path from "node:path";
import {Tokenizer} from "@huggingface/tokenizers";

const [dir, textsPath] = process.argv.slice(2);
const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const config = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8"));
const tokenizer = new Tokenizer(json, config);
const texts = JSON.parse(fs.readFileSync(textsPath, "utf8"));
const ids = texts.map((t) => Array.from(tokenizer.encode(t).ids));
process.stdout.write(JSON.stringify({ids}) + "\n");
