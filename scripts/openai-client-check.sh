#!/usr/bin/env bash
# Checks `engine serve` against a real third-party client: the `openai` Python package
# (from PyPI, in a throwaway venv under /tmp) streams a chat completion and a completion.
#
# Usage: scripts/openai-client-check.sh [BASE_URL] [MODEL] [API_KEY]
#   BASE_URL  default http://127.0.0.1:8000/v1 (start the server first: engine serve ...)
#   MODEL     default: the first model the server lists
#   API_KEY   default: "none" (use the server's --api-key if it has one)
set -euo pipefail

base_url="${1:-http://127.0.0.1:8000/v1}"
model="${2:-}"
api_key="${3:-none}"

venv="$(mktemp -d /tmp/openai-client-check.XXXXXX)"
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check openai

"$venv/bin/python" - "$base_url" "$model" "$api_key" <<'PY'
import sys

import openai

base_url, model, api_key = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=base_url, api_key=api_key)
if not model:
    model = client.models.list().data[0].id
print(f"openai {openai.__version__}, server {base_url}, model {model}")

stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=32,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
roles, text, finish, usage, chunks = [], "", None, None, 0
for chunk in stream:
    chunks += 1
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.role:
            roles.append(choice.delta.role)
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
print(f"chat stream: {chunks} chunks, finish_reason={finish}, usage={usage}")
print(f"answer: {text!r}")
assert roles == ["assistant"], f"expected one role delta first, got {roles}"
assert text.strip(), "empty answer"
assert finish in ("stop", "length"), finish
assert usage is not None and usage.completion_tokens > 0, usage
assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage

completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
print(f"completion: {completion.choices[0].text!r}, usage={completion.usage}")
assert completion.usage.completion_tokens > 0

try:
    client.completions.create(model=model, prompt="x", max_tokens=-1)
    raise AssertionError("a negative max_tokens must be refused")
except openai.BadRequestError as e:
    print(f"bad request refused as expected: {e.status_code} param={e.body.get('param') if isinstance(e.body, dict) else None}")
print("OK: the openai client works with this server")
PY
