#!/usr/bin/env bash
# Walks README.md top to bottom on a fresh demo run, as a new user would, and checks that every command
# exits as documented: train with a held-out eval, Ctrl-C and resume, resume of the finished run, rz eval on
# the run (its own env; a math set), rz serve on the run + one OpenAI-client request, a custom env from the
# working directory, and screenshots of report.html / inspector.html (headless Chromium, where installed).
#
#   bash scripts/new_user_walk.sh           # the packaged demo (about 5 min of training on 2 idle cores)
#   QUICK=1 bash scripts/new_user_walk.sh   # the same commands on a shortened demo (few steps, small warm start)
#   WORK=DIR bash scripts/new_user_walk.sh  # walk in DIR (default: a new temporary directory); files stay there
set -euo pipefail
set -m  # job control: a background rz gets SIGINT as a terminal's Ctrl-C would give it
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
cd "$WORK"
RUN=runs/demo
EXTRA=()
if [ "${QUICK:-0}" = 1 ]; then
  EXTRA=(steps=6 warm_start.demos=200 warm_start.epochs=1 warm_start.prior_demos=32 eval.num_tasks=4)
fi
echo "walking in $WORK"

step() { printf '\n=== %s\n' "$*"; }
# expect STATUS COMMAND...: run it, show its output's tail, fail unless it exits STATUS
expect() {
  local want=$1; shift
  echo "\$ $*"
  set +e; "$@" >out.txt 2>&1; local got=$?; set -e
  tail -n "${TAIL:-12}" out.txt
  [ "$got" = "$want" ] || { echo "FAILED: exit $got (documented: $want): $*"; exit 1; }
  echo "(exit $got, as documented)"
}
must_say() { grep -qF -- "$1" out.txt || { echo "FAILED: no '$1' in the output above"; exit 1; }; }

step "1. rz train demo eval.every=2 eval.at_start=true, Ctrl-C once two steps are logged"
echo "\$ rz train demo --run-dir $RUN eval.every=2 eval.at_start=true ${EXTRA[*]}  (then Ctrl-C)"
rz train demo --run-dir "$RUN" eval.every=2 eval.at_start=true "${EXTRA[@]}" >train1.txt 2>&1 &
pid=$!
until [ -f "$RUN/metrics.jsonl" ] && [ "$(wc -l <"$RUN/metrics.jsonl")" -ge 2 ]; do
  kill -0 "$pid" 2>/dev/null || { tail -20 train1.txt; echo "FAILED: rz train ended early"; exit 1; }
  sleep 1
done
kill -INT "$pid"
set +e; wait "$pid"; got=$?; set -e
tail -n 4 train1.txt
[ "$got" = 130 ] || { echo "FAILED: exit $got after Ctrl-C (documented: 130)"; exit 1; }
grep -qF "resume with: rz train --resume $RUN" train1.txt || { echo "FAILED: no resume line"; exit 1; }

step "2. rz train --resume (the run's whole history: every launch)"
TAIL=16 expect 0 rz train --resume "$RUN"
must_say "over 2 launches"
must_say "held-out"
must_say "(before step 0) ->"  # eval.at_start: the curve starts at the untrained policy, kept across the resume

step "3. rz train --resume of the finished run: says so, changes nothing"
before=$(md5sum "$RUN/summary.json")
expect 0 rz train --resume "$RUN"
must_say "finished at step"
[ "$(md5sum "$RUN/summary.json")" = "$before" ] || { echo "FAILED: summary.json changed"; exit 1; }

step "4. rz eval RUN/config.yaml (its eval: section, its final_model)"
expect 0 rz eval "$RUN/config.yaml" --quiet

step "5. rz eval RUN --benchmark aime24 --limit 2 (the demo's 512 positions cannot hold AIME: one line, exit 1)"
expect 1 rz eval "$RUN" --benchmark aime24 --limit 2 --k 2 --quiet
must_say "max_position_embeddings"

step "6. rz serve RUN + one request with the openai client"
rz serve "$RUN" --port 8765 >serve.txt 2>&1 &
spid=$!
python3 - <<'EOF'
import time, urllib.request
for _ in range(600):
    try:
        urllib.request.urlopen("http://127.0.0.1:8765/v1/models", timeout=2)
        break
    except OSError:
        time.sleep(0.5)
from openai import OpenAI
client = OpenAI(base_url="http://127.0.0.1:8765/v1", api_key="none")
model = client.models.list().data[0].id
reply = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "What is 2+3?"}], max_tokens=24
)
print(f"model {model!r} answered {reply.choices[0].message.content!r}")
EOF
kill "$spid"; wait "$spid" 2>/dev/null || true
head -n 2 serve.txt

step "7. a custom env from the working directory (imports: [my_envs])"
mkdir -p my_envs
cat >my_envs/__init__.py <<'EOF'
from rz_agents.envs import MultiTurnTextEnv


class EchoEnv(MultiTurnTextEnv):
    """Reward 1 for replying with the word asked for."""

    def _reset(self, task, rng):
        self.word = (task or {}).get("word", "hello")
        return f"Reply with the word {self.word}.", {}

    def _step(self, text):
        return None, float(self.word in text), True, {}
EOF
printf 'imports: [my_envs]\nenv: {id: "my_envs:EchoEnv"}\nsteps: 2\n' >my_env.yaml
expect 2 rz train my_env.yaml --dry-run
must_say "it is in the working directory"
expect 0 env PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" rz train my_env.yaml --dry-run

step "8. report.html and inspector.html (headless Chromium screenshots)"
grep -qF "step -1: before training (eval.at_start)" "$RUN/report.html" || { echo "FAILED: no start point"; exit 1; }
chromium=$(command -v chromium || command -v chromium-browser || true)
if [ -n "$chromium" ]; then
  for page in report inspector; do
    "$chromium" --headless --no-sandbox --disable-gpu --window-size=1200,1600 \
      --screenshot="$WORK/$page.png" "file://$WORK/$RUN/$page.html" >/dev/null 2>&1
    ls -l "$WORK/$page.png"
  done
else
  echo "(no chromium here: screenshots skipped)"
fi
printf '\nnew-user walk: every step exited as documented (%s)\n' "$WORK"
