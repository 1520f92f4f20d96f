"""Greedy answers of two servers to the same random token-id prompts, compared token by token:
for models whose vocabulary is the references' `<i>` tokens (scripts/make-moe-bench-models.py),
where text prompts do not apply. Each server is `llama:PORT` (llama-server's /completion) or
`engine:PORT` (/v1/completions); an answer's tokens are its `<i>` pieces. Prints each pair and
a summary line: identical answers, and how many leading tokens agree.

Usage: token-greedy-agreement.py LABEL FIRST SECOND [PROMPTS]   (PROMPTS default 12)"""
import json
import random
import sys
import urllib.request


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=300))


def answer(server, ids):
    kind, port = server.split(":")
    if kind == "llama":
        return post(port, "/completion", {"prompt": ids, "n_predict": 16, "temperature": 0,
                                          "top_k": 1, "ignore_eos": True,
                                          "cache_prompt": False})["content"]
    return post(port, "/v1/completions", {"prompt": ids, "max_tokens": 16, "temperature": 0,
                                          "ignore_eos": True})["choices"][0]["text"]


def main():
    label, first, second = sys.argv[1:4]
    count = int(sys.argv[4]) if len(sys.argv) > 4 else 12
    rng = random.Random(7)
    leading, identical = [], 0
    for n in range(count):
        ids = [rng.randrange(3, 255) for _ in range(rng.randrange(8, 64))]
        a, b = answer(first, ids), answer(second, ids)
        ta, tb = a.replace("><", ">\0<").split("\0"), b.replace("><", ">\0<").split("\0")
        k = 0
        while k < min(len(ta), len(tb)) and ta[k] == tb[k]:
            k += 1
        leading.append(k)
        identical += a == b
        print(f"{label} prompt {n} ({len(ids)} tokens): {k} leading tokens agree\n  {a}\n  {b}")
    print(f"{label}: {identical}/{count} identical 16-token answers; leading tokens agreeing: "
          f"{leading}; first token agrees in {sum(k > 0 for k in leading)}/{count}")


if __name__ == "__main__":
    main()
