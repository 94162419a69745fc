// Oracle half of gen_bpe_oracle.py: encodes DIR/texts.json with js-tiktoken over the ranks in
// DIR/ranks.json under each family's pattern (the (?i:...) contraction groups written out, as
// JavaScript regexes have no inline flags), writing DIR/ids.json.
// Usage: node bpe_oracle.mjs DIR NODE_MODULES_DIR
import fs from "fs";
import path from "path";
import { pathToFileURL } from "url";

const [dir, modules] = process.argv.slice(2);
const { Tiktoken } = await import(pathToFileURL(path.join(modules, "js-tiktoken/dist/lite.js")).href);
const ranks = JSON.parse(fs.readFileSync(path.join(dir, "ranks.json")));
const texts = JSON.parse(fs.readFileSync(path.join(dir, "texts.json")));
const C = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
const UP = "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]", LO = "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]";
const pats = {
  "llama-bpe": C + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
  "qwen2": C + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
  "gpt-4o": "[^\\r\\n\\p{L}\\p{N}]?" + UP + "*" + LO + "+" + C + "?|[^\\r\\n\\p{L}\\p{N}]?" + UP + "+" + LO + "*" +
    C + "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};
const out = {};
for (const [name, pat] of Object.entries(pats)) {
  const enc = new Tiktoken({ pat_str: pat, special_tokens: {}, bpe_ranks: "! 0 " + ranks.join(" ") });
  out[name] = texts.map((t) => enc.encode(t));
}
fs.writeFileSync(path.join(dir, "ids.json"), JSON.stringify(out));
