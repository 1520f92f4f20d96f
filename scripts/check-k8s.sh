#!/usr/bin/env bash
# Checks deploy/k8s/*.yaml offline (no cluster): each manifest, with its ${VARIABLES}
# substituted as docs/guide/merge-and-shards.md does, validates strictly (unknown fields are errors) against the
# Kubernetes API schema bundled in PyPI's `kubernetes-validate`; the shard Job is an Indexed
# Job whose completions, parallelism and --shard K agree, and the merge Job reads every shard
# folder; and the loadgen command lines of both Jobs parse (the binary is run with them and
# must fail on the missing server or folders, not on its arguments).
# Installs kubernetes-validate into a per-user cache on the first run (needs python3 + pip).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(./scripts/pip-target.sh kubernetes-validate 1.34.0)
LOADGEN=${LOADGEN:-target/release/loadgen}
test -x "$LOADGEN" || { echo "check-k8s.sh: build $LOADGEN first (cargo build --release)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export RUN=20261123-120000 START_AT=2099-01-01T00:00:00Z TARGET_URL=http://127.0.0.1:9
export LOADGEN_IMAGE=registry.example/loadgen:0.1 ENGINE_IMAGE=registry.example/engine:0.1
for f in deploy/k8s/*.yaml; do
    envsubst '$RUN $START_AT $TARGET_URL $LOADGEN_IMAGE $ENGINE_IMAGE' < "$f" > "$tmp/$(basename "$f")"
done
PYTHONPATH="$dir" python3 -m kubernetes_validate --strict --no-warn "$tmp"/*.yaml
PYTHONPATH="$dir" python3 - "$tmp" "$LOADGEN" <<'PY'
import os, re, shlex, subprocess, sys, yaml
tmp, loadgen = sys.argv[1], sys.argv[2]
docs = lambda name: [d for d in yaml.safe_load_all(open(os.path.join(tmp, name))) if d]
job = next(d for d in docs("loadgen-job.yaml") if d["kind"] == "Job")
spec = job["spec"]
assert spec["completionMode"] == "Indexed", "the shard Job must be Indexed"
k = spec["completions"]
assert spec["parallelism"] == k, f"parallelism {spec['parallelism']} != completions {k}"
script = spec["template"]["spec"]["containers"][0]["args"][0]
shard = re.search(r'--shard "\$JOB_COMPLETION_INDEX/(\d+)"', script)
assert shard and int(shard.group(1)) == k, f"--shard K must be the completions ({k})"
merge = next(d for d in docs("loadgen-merge.yaml") if d["kind"] == "Job")
merge_script = merge["spec"]["template"]["spec"]["containers"][0]["args"][0]
for i in range(k):
    assert f"/results/{os.environ['RUN']}/shard-{i}" in merge_script, f"the merge Job does not read shard {i}"
claims = {v["persistentVolumeClaim"]["claimName"]
          for j in (job, merge) for v in j["spec"]["template"]["spec"]["volumes"]}
assert len(claims) == 1, f"the Jobs mount different volumes: {claims}"

def run(script, env):
    script = script.replace("exec loadgen", "").replace("/results", os.path.join(tmp, "results"))
    os.environ.update(env)
    argv = shlex.split(os.path.expandvars(script.strip()))
    out = subprocess.run([loadgen] + argv, capture_output=True,
                         text=True, timeout=120)
    # clap exits with 2 on a usage error; 1 is the missing server or folder.
    assert out.returncode == 1, f"{argv}: exit {out.returncode}: {out.stderr[-600:]}"
    return out.stderr

env = {"JOB_COMPLETION_INDEX": "1", "RUN": os.environ["RUN"], "TARGET_URL": "http://127.0.0.1:9"}
err = run(script, env)
assert "127.0.0.1:9" in err, err
err = run(merge_script, env)
assert "shard-0" in err, err
print(f"check-k8s.sh: manifests valid; Indexed Job of {k} shards; loadgen command lines parse")
PY
