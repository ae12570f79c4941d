"""The program's side: report an episode's reward to the trainer that started it (standard library only)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

ENV_REWARD_URL, ENV_API_KEY, ENV_ROLLOUT = "ECHO_RL_REWARD_URL", "OPENAI_API_KEY", "ECHO_RL_ROLLOUT_ID"


def report(reward: float, task: str | None = None, *, url: str | None = None, key: str | None = None,
           timeout: float = 30.0) -> None:
    """Send this episode's ``reward`` (and the ``task`` it played: episodes of one task form a GRPO group).

    Reads the variables ``echo-rl train --task external`` sets for each episode; outside training (no
    ``ECHO_RL_REWARD_URL``) it does nothing, so the same program runs against any OpenAI endpoint. ``url`` and
    ``key`` override the variables (a program that runs several episodes in one process).
    """
    url = url or os.environ.get(ENV_REWARD_URL)
    key = key or os.environ.get(ENV_API_KEY, "")
    if not url:
        return
    body = json.dumps({"reward": reward, "task": task}).encode()
    req = urllib.request.Request(url, body, {"Content-Type": "application/json",
                                             "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:  # the trainer's one-line reason, not a traceback of urllib's
        detail = exc.read().decode("utf-8", "replace")
        try:
            detail = json.loads(detail)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            pass
        raise RuntimeError(f"echo-rl refused the reward ({exc.code}): {detail}") from None
