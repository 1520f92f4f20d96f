"""How far servers' next-token distributions stray from a reference server's, at the same
contexts: for each of the greedy-agreement prompts, the reference's greedy answer (16 tokens)
is re-tokenised and every prefix of it after the prompt (17 contexts, as token ids) is sent to
every server for one token with its top 5 log-probabilities. At each context the reference's
top-1 token t* is taken, and a server's gap is |its logprob of t* - the reference's|
(t* outside its top 5 counts as a miss, reported apart). Prints, per server, the contexts whose
top-1 token matches the reference's, the largest and mean gap, and the misses.

Usage: logprob-gap.py LABEL REFERENCE_PORT TOKENIZE_PORT NAME=PORT [NAME=PORT ...] [--prompts N]
(each port an OpenAI-compatible /v1/completions taking token-id prompts: ours or llama-server)."""
import importlib.util
import json
import os
import sys
import urllib.request

spec = importlib.util.spec_from_file_location(
    "greedy_agreement", os.path.join(os.path.dirname(__file__), "greedy-agreement.py"))
greedy_agreement = importlib.util.module_from_spec(spec)
spec.loader.exec_module(greedy_agreement)
PROMPTS = greedy_agreement.PROMPTS
post = greedy_agreement.post


def next_token(port, ids):
    """(top-1 token text, {token text: logprob} of the top 5) after the context `ids`."""
    c = post(port, "/v1/completions",
             {"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 5})["choices"][0]
    lp = c["logprobs"]
    if "content" in lp:  # llama-server
        first = lp["content"][0]
        return first["token"], {t["token"]: t["logprob"] for t in first["top_logprobs"]}
    top = lp["top_logprobs"][0]
    return lp["tokens"][0], dict(top)


def main():
    args = sys.argv[1:]
    count = 32
    if "--prompts" in args:
        at = args.index("--prompts")
        count = int(args[at + 1])
        del args[at:at + 2]
    label, reference, tokenize = args[0], int(args[1]), int(args[2])
    servers = [(a.split("=")[0], int(a.split("=")[1])) for a in args[3:]]
    stats = {name: {"match": 0, "gaps": [], "misses": 0, "worst": None} for name, _ in servers}
    contexts = 0
    for p in PROMPTS[:count]:
        ask = {"prompt": p, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
        answer = post(reference, "/v1/completions", ask)["choices"][0]["text"]
        prompt_ids = post(tokenize, "/tokenize", {"prompt": p})["tokens"]
        answer_ids = post(tokenize, "/tokenize", {"prompt": answer, "add_special_tokens": False})["tokens"]
        for i in range(len(answer_ids) + 1):
            ids = prompt_ids + answer_ids[:i]
            top, ref = next_token(reference, ids)
            contexts += 1
            for name, port in servers:
                got_top, got = next_token(port, ids)
                s = stats[name]
                s["match"] += got_top == top
                if top in got:
                    gap = abs(got[top] - ref[top])
                    s["gaps"].append(gap)
                    if s["worst"] is None or gap > s["worst"][0]:
                        s["worst"] = (gap, p, i, top)
                else:
                    s["misses"] += 1
    for name, _ in servers:
        s = stats[name]
        gaps = s["gaps"]
        print(f"{label}, {name} against the reference: top-1 token matches at {s['match']} of "
              f"{contexts} contexts; top-1 logprob gap largest {max(gaps):.4f}, mean "
              f"{sum(gaps) / len(gaps):.4f} (largest at {s['worst'][1]!r} after {s['worst'][2]} "
              f"answer tokens, {s['worst'][3]!r}); reference top-1 outside its top 5: {s['misses']}")


if __name__ == "__main__":
    main()
