"""Greedy answers of two OpenAI-compatible servers to the same prompts, compared token by
token: prints each pair and how many leading tokens agree (both answers tokenised by our
engine's /tokenize), then a summary line. Used by scripts/kquant-greedy-check.sh and
scripts/gemma-greedy-check.sh.

Usage: greedy-agreement.py LABEL FIRST_PORT SECOND_PORT SECOND_NAME TOKENIZE_PORT PROMPTS
(the first server is llama-server; PROMPTS is 4 or 32)."""
import json
import sys
import urllib.request

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there was a",
           "The three primary colors are", "The best way to learn a new language is",
           "import numpy as np\n", "Water boils at", "My favourite season is",
           "The mitochondria is", "In 1492, Columbus", "To make a cup of tea, first",
           "The largest planet in the solar system is", "SELECT name FROM users WHERE",
           "Dear hiring manager,", "The quick brown fox", "A healthy breakfast includes",
           "The theory of relativity states that", "Photosynthesis is the process by which",
           "for i in range(10):", "The main causes of climate change are",
           "Shakespeare wrote", "The recipe calls for two cups of", "Machine learning is",
           "The stock market today", "Once the rain stopped, the children",
           "A triangle has", "The human heart has four", "To reverse a string in Python,",
           "The moon orbits", "Good morning! Today we will learn about",
           "The French Revolution began in", "An apple a day"]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))


def main():
    label, first, second, against, tokenize, count = sys.argv[1:7]
    agree = []
    for p in PROMPTS[:int(count)]:
        ask = {"prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
        texts = [post(int(port), "/v1/completions", ask)["choices"][0]["text"]
                 for port in (first, second)]
        ids = [post(int(tokenize), "/tokenize", {"prompt": t, "add_special_tokens": False})["tokens"]
               for t in texts]
        n = next((i for i, (a, b) in enumerate(zip(*ids)) if a != b), min(map(len, ids)))
        agree.append(n)
        print(f"  {p!r}: {n} leading tokens agree\n    llama.cpp: {texts[0]!r}\n"
              f"    {against + ':':11s}{texts[1]!r}")
    print(f"{label}, llama-server against {against}: leading tokens in agreement {agree}; "
          f"prompts with >= 8: {sum(a >= 8 for a in agree)} of {len(agree)}")


if __name__ == "__main__":
    main()
