"""A program that misbehaves by episode number (ECHO_RL_EPISODE), for the runner's tests; notes go to $OUT_DIR."""

import os
import sys
import time
from pathlib import Path

import openai

from echo_rl.external import report

i = int(os.environ["ECHO_RL_EPISODE"])
mode = os.environ.get("MODE", "mixed")
note = Path(os.environ["OUT_DIR"]) / f"{i}.txt"
if mode == "mixed" and i == 1:
    print("boom: the program failed", file=sys.stderr)
    sys.exit(3)
if mode == "mixed" and i == 2:
    time.sleep(120)  # hangs: killed at the episode timeout
client = openai.OpenAI(max_retries=0)
client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
if mode == "slow":
    time.sleep(float(os.environ.get("SLEEP", "2")))
lines = [os.environ["ECHO_RL_ROLLOUT_ID"], os.environ["ECHO_RL_REWARD_URL"]]
if mode == "mixed" and i == 5:  # a reward for a rollout that does not exist
    try:
        report(1.0, url=os.environ["ECHO_RL_REWARD_URL"].replace(lines[0], "nosuchrollout"))
    except RuntimeError as exc:
        lines.append(str(exc))
if mode == "mixed" and i == 6:  # the wrong key
    try:
        report(1.0, key="wrong")
    except RuntimeError as exc:
        lines.append(str(exc))
if not (mode == "mixed" and i == 3):  # episode 3 never reports
    report(float(i), task="t")
if mode == "mixed" and i == 4:  # a second reward for one episode
    try:
        report(2.0, task="t")
    except RuntimeError as exc:
        lines.append(str(exc))
note.write_text("\n".join(lines))
