#!/usr/bin/env python3
"""Fuzz and soak traffic against a running `engine serve` (see scripts/soak.sh).

Sends a seeded mix of well-formed requests (completions and chats, streaming and not, n > 1,
logprobs, stop strings, seeds, penalties, unknown fields) and bad ones (malformed JSON, wrong
types, out-of-range values, oversize bodies and prompts, max_tokens past the context), floods
past --max-waiting-requests, and clients that hang up at random points. Every answer is
checked: well-formed requests get well-formed answers (usage adds up, finish_reason right,
output within max_tokens, no stop string in the text) or a 429 under a flood; bad ones get a
4xx with an OpenAI error body naming the field at fault; nothing gets a 5xx. At the end the
server must be idle (no request running, no KV block in use) and healthy, and its RSS may grow
by at most 5% between the ends of the two halves. Exits 1 on any violation, listing them.
"""

import argparse
import concurrent.futures as cf
import http.client
import json
import random
import re
import socket
import sys
import threading
import time

STOPS = ["the", "\n", "ing", "."]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Soak:
    def __init__(self, args):
        self.host, self.port = args.host, args.port
        self.args = args
        self.lock = threading.Lock()
        self.counts = {}
        self.failures = []

    def count(self, key):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def fail(self, what):
        with self.lock:
            if len(self.failures) < 50:
                self.failures.append(what)
            self.counts["violations"] = self.counts.get("violations", 0) + 1

    def conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=120)

    def post(self, path, body_bytes):
        c = self.conn()
        try:
            c.request("POST", path, body=body_bytes, headers={"content-type": "application/json"})
            r = c.getresponse()
            return r.status, r.getheaders(), r.read()
        finally:
            c.close()

    # ---- request generators -------------------------------------------------------------

    def valid_request(self, rng):
        chat = rng.random() < 0.4
        stream = rng.random() < 0.5
        n = rng.choice([1, 1, 1, 2, 3])
        max_tokens = rng.randint(1, 24)
        body = {"model": "soak", "max_tokens": max_tokens, "n": n, "stream": stream}
        if chat:
            body["messages"] = [{"role": "user", "content": " ".join(rng.choice(
                ["hello", "world", "the", "cat", "sat", "on", "a", "mat", "é", "数"]) for _ in range(rng.randint(1, 30)))}]
        elif rng.random() < 0.5:
            body["prompt"] = [rng.randint(3, 4000) for _ in range(rng.randint(1, 200))]
        else:
            body["prompt"] = "Once upon a time " * rng.randint(1, 20)
        if rng.random() < 0.5:
            body["temperature"] = rng.choice([0.0, 0.7, 1.0, 1.5])
            body["seed"] = rng.randint(0, 1 << 30)
        if rng.random() < 0.3:
            body["top_p"] = rng.choice([0.5, 0.9, 1.0])
            body["top_k"] = rng.choice([0, 1, 5, 50])
        if rng.random() < 0.3:
            body["presence_penalty"] = rng.choice([-1.0, 0.5, 1.5])
            body["frequency_penalty"] = rng.choice([-0.5, 0.3, 2.0])
            body["repetition_penalty"] = rng.choice([0.8, 1.2, 1.5])
        if rng.random() < 0.3:
            body["stop"] = rng.sample(STOPS, rng.randint(1, 2))
        if rng.random() < 0.3:
            if chat:
                body["logprobs"] = True
                body["top_logprobs"] = rng.randint(0, 5)
            else:
                body["logprobs"] = rng.randint(0, 5)
        if stream and rng.random() < 0.7:
            body["stream_options"] = {"include_usage": True}
        if rng.random() < 0.1:
            body["ignore_eos"] = True
        if rng.random() < 0.1:
            # Fields that change nothing in the answer are accepted (an unknown one is a 400).
            body["user"] = "soak"
            body["metadata"] = {"x": "1"}
        return ("/v1/chat/completions" if chat else "/v1/completions"), body

    def bad_request(self, rng):
        """Returns (path, raw bytes, the field the error must name or None)."""
        kind = rng.choice(["json", "type_max_tokens", "type_temperature", "range_top_p", "range_n",
                           "oversize_body", "oversize_prompt", "max_tokens_past_context",
                           "missing_prompt", "bad_messages", "bad_token_id", "logprobs_range",
                           "unknown_field"])
        base = {"model": "soak", "prompt": "hello", "max_tokens": 4}
        field = None
        if kind == "json":
            raw = rng.choice([b"{", b"{\"prompt\": ", b"[1, 2", b"not json", b"{\"prompt\": \"a\",}"])
            return "/v1/completions", raw, None
        if kind == "type_max_tokens":
            base["max_tokens"], field = "many", "max_tokens"
        elif kind == "type_temperature":
            base["temperature"], field = [1], "temperature"
        elif kind == "range_top_p":
            base["top_p"], field = 0.0, "top_p"
        elif kind == "range_n":
            base["n"], field = 0, "n"
        elif kind == "oversize_body":
            base["prompt"] = "x" * (self.args.max_body_bytes + 10)
        elif kind == "oversize_prompt":
            base["prompt"], field = [5] * (self.args.max_model_len + 10), "prompt"
        elif kind == "max_tokens_past_context":
            base["max_tokens"], field = self.args.max_model_len + 1, None
        elif kind == "missing_prompt":
            del base["prompt"]
            field = "prompt"
        elif kind == "bad_messages":
            return "/v1/chat/completions", json.dumps({"model": "soak", "messages": [{"role": 7}]}).encode(), "messages"
        elif kind == "bad_token_id":
            base["prompt"], field = [1, 2, 10 ** 9], "prompt"
        elif kind == "logprobs_range":
            base["logprobs"], field = 99, "logprobs"
        elif kind == "unknown_field":
            base["some_unknown_field"], field = {"x": 1}, "some_unknown_field"
        return "/v1/completions", json.dumps(base).encode(), field

    # ---- checks -------------------------------------------------------------------------

    def check_error_body(self, status, raw, field, what):
        try:
            err = json.loads(raw)["error"]
        except Exception:
            self.fail(f"{what}: {status} without an OpenAI error body: {raw[:200]!r}")
            return
        if not isinstance(err.get("message"), str) or not err.get("type"):
            self.fail(f"{what}: error body lacks message/type: {err}")
        if field and field not in (err.get("param") or "") and field not in err.get("message", ""):
            self.fail(f"{what}: error does not name `{field}`: {err}")

    def check_choice_text(self, body, text, finish, tokens, what):
        if finish not in ("stop", "length"):
            self.fail(f"{what}: finish_reason {finish!r}")
        for s in body.get("stop") or []:
            if s in text:
                self.fail(f"{what}: stop string {s!r} in the output {text!r}")
        if tokens is not None and tokens > body["max_tokens"]:
            self.fail(f"{what}: {tokens} tokens > max_tokens {body['max_tokens']}")

    def check_full(self, body, raw, what):
        try:
            r = json.loads(raw)
        except Exception:
            self.fail(f"{what}: 200 with a body that is not JSON: {raw[:200]!r}")
            return
        choices = r.get("choices") or []
        if len(choices) != body["n"]:
            self.fail(f"{what}: {len(choices)} choices for n={body['n']}")
        u = r.get("usage") or {}
        if u.get("prompt_tokens", -1) + u.get("completion_tokens", -1) != u.get("total_tokens"):
            self.fail(f"{what}: usage does not add up: {u}")
        if u.get("completion_tokens", 0) > body["max_tokens"] * body["n"]:
            self.fail(f"{what}: {u.get('completion_tokens')} completion tokens > {body['max_tokens']} x n={body['n']}")
        for c in choices:
            text = c["message"]["content"] if "message" in c else c.get("text", "")
            self.check_choice_text(body, text or "", c.get("finish_reason"), None, what)

    def run_stream(self, path, body, rng, what):
        """Streams, possibly hanging up at a random point; checks what arrived."""
        hang_after = rng.randint(0, 6) if rng.random() < self.args.disconnect_fraction else None
        c = self.conn()
        try:
            c.request("POST", path, body=json.dumps(body).encode(), headers={"content-type": "application/json"})
            r = c.getresponse()
            if r.status == 429:
                if not r.getheader("retry-after"):
                    self.fail(f"{what}: 429 without Retry-After")
                self.count("429")
                r.read()
                return
            if r.status != 200:
                self.fail(f"{what}: stream answered {r.status}: {r.read()[:200]!r}")
                return
            texts, finishes, usage, done, events = {}, {}, None, False, 0
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                events += 1
                if hang_after is not None and events > hang_after:
                    self.count("disconnected")
                    c.sock.shutdown(socket.SHUT_RDWR)
                    return
                if data == b"[DONE]":
                    done = True
                    break
                ev = json.loads(data)
                if "error" in ev:
                    self.fail(f"{what}: error event in a well-formed stream: {ev}")
                    continue
                if ev.get("usage"):
                    usage = ev["usage"]
                for ch in ev.get("choices", []):
                    i = ch["index"]
                    delta = ch.get("delta", {}).get("content") if "delta" in ch else ch.get("text")
                    texts[i] = texts.get(i, "") + (delta or "")
                    if ch.get("finish_reason"):
                        finishes[i] = ch["finish_reason"]
            if not done:
                self.fail(f"{what}: stream ended without [DONE]")
            if len(finishes) != body["n"]:
                self.fail(f"{what}: {len(finishes)} finished choices for n={body['n']}")
            for i, f in finishes.items():
                self.check_choice_text(body, texts.get(i, ""), f, None, what)
            if (body.get("stream_options") or {}).get("include_usage"):
                if not usage or usage["prompt_tokens"] + usage["completion_tokens"] != usage["total_tokens"]:
                    self.fail(f"{what}: missing or inconsistent usage chunk: {usage}")
                elif usage["completion_tokens"] > body["max_tokens"] * body["n"]:
                    self.fail(f"{what}: usage {usage} exceeds max_tokens x n")
            self.count("ok")
        finally:
            c.close()

    def one(self, i):
        rng = random.Random(self.args.seed * 1_000_003 + i)
        what = f"request {i}"
        try:
            if rng.random() < self.args.bad_fraction:
                path, raw, field = self.bad_request(rng)
                status, _, body = self.post(path, raw)
                if status >= 500:
                    self.fail(f"{what} (bad): {status}: {body[:200]!r}")
                elif 400 <= status < 500:
                    self.check_error_body(status, body, field, what + " (bad)")
                    self.count("4xx")
                else:
                    self.fail(f"{what} (bad, field {field}): accepted with {status}: {raw[:120]!r}")
                return
            path, body = self.valid_request(rng)
            if body["stream"]:
                self.run_stream(path, body, rng, what)
                return
            status, headers, raw = self.post(path, json.dumps(body).encode())
            if status == 429:
                if not any(k.lower() == "retry-after" for k, _ in headers):
                    self.fail(f"{what}: 429 without Retry-After")
                self.count("429")
            elif status != 200:
                self.fail(f"{what}: {status} for a well-formed request: {raw[:200]!r}")
            else:
                self.check_full(body, raw, what)
                self.count("ok")
        except Exception as e:  # a transport failure is a violation too
            self.fail(f"{what}: {type(e).__name__}: {e}")

    def metrics(self):
        c = self.conn()
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        out = {}
        for line in text.splitlines():
            if line.startswith("vllm:") and " " in line:
                name, value = line.rsplit(" ", 1)
                reason = re.search(r'finished_reason="([a-z]+)"', name)
                key = name.split("{")[0] + (f":{reason.group(1)}" if reason else "")
                out[key] = float(value)
        return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid", type=int, required=True, help="the server's pid (RSS)")
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--flood", type=int, default=96, help="simultaneous requests opening each half")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup-fraction", type=float, default=0.1, help="requests before the two measured halves")
    p.add_argument("--bad-fraction", type=float, default=0.3)
    p.add_argument("--disconnect-fraction", type=float, default=0.1)
    p.add_argument("--max-body-bytes", type=int, required=True)
    p.add_argument("--max-model-len", type=int, required=True)
    args = p.parse_args()
    soak = Soak(args)
    started = time.time()
    rss = []
    # A warm-up share first (the allocator and the lazily sized buffers settle), then two
    # equal halves, each opening with a flood of simultaneous requests past the server's
    # waiting limit; RSS is read at the end of each half.
    warm = int(args.requests * args.warmup_fraction)
    half = (args.requests - warm) // 2
    phases = [(0, warm, False), (warm, warm + half, True), (warm + half, args.requests, True)]
    for lo, hi, measured in phases:
        flood = min(args.flood, (hi - lo) // 4) if measured else 0
        with cf.ThreadPoolExecutor(max(flood, 1)) as pool:
            list(pool.map(soak.one, range(lo, lo + flood)))
        with cf.ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(soak.one, range(lo + flood, hi)))
        if measured:
            time.sleep(1.0)
            rss.append(rss_kib(args.pid))
    # Let disconnected streams be reaped, then the server must be idle and healthy.
    deadline = time.time() + 30
    while True:
        m = soak.metrics()
        idle = (m.get("vllm:num_requests_running", 1) == 0 and m.get("vllm:num_requests_waiting", 1) == 0
                and m.get("vllm:kv_cache_usage_perc", 1) == 0)
        if idle or time.time() > deadline:
            break
        time.sleep(0.5)
    if not idle:
        soak.fail(f"server not idle at the end: running {m.get('vllm:num_requests_running')}, "
                  f"waiting {m.get('vllm:num_requests_waiting')}, KV usage {m.get('vllm:kv_cache_usage_perc')}")
    if m.get("vllm:request_success_total:error", 0) > 0:
        soak.fail(f"{int(m['vllm:request_success_total:error'])} sequences finished with an error")
    # 429s are allowed under the floods, not as the answer to most well-formed requests.
    valid = soak.counts.get("ok", 0) + soak.counts.get("429", 0) + soak.counts.get("disconnected", 0)
    if soak.counts.get("ok", 0) < 0.5 * valid:
        soak.fail(f"only {soak.counts.get('ok', 0)} of {valid} well-formed requests were answered")
    c = soak.conn()
    c.request("GET", "/health")
    health = c.getresponse().status
    c.close()
    if health != 200:
        soak.fail(f"/health answered {health} at the end")
    growth = (rss[1] - rss[0]) / max(rss[0], 1)
    if growth > 0.05:
        soak.fail(f"RSS grew {100 * growth:.1f}% between the two halves ({rss[0]} -> {rss[1]} KiB)")
    secs = time.time() - started
    finished = {k.split(":")[-1]: int(v) for k, v in m.items() if k.startswith("vllm:request_success_total:")}
    print(f"soak: {args.requests} requests in {secs:.1f}s ({args.requests / secs:.0f}/s), concurrency {args.concurrency}, seed {args.seed}")
    print(f"  outcomes: {dict(sorted(soak.counts.items()))}")
    print(f"  server at the end: running {int(m.get('vllm:num_requests_running', -1))}, "
          f"KV usage {m.get('vllm:kv_cache_usage_perc')}, health {health}, finished by reason {finished}")
    print(f"  RSS at the end of each half: {rss[0]} KiB, {rss[1]} KiB ({100 * growth:+.2f}%)")
    if soak.failures:
        print(f"  {soak.counts.get('violations')} violations; the first ones:")
        for f in soak.failures[:20]:
            print("   -", f)
        sys.exit(1)
    print("  no violations")


if __name__ == "__main__":
    main()
