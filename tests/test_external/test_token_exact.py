"""Token-in, token-out for a user's program: what is trained is what the engine was given and sampled, plus the
template's tokens for what the program sent; an edited or re-sent history splits the episode, counted.

A real chat program (the official openai client, tools and plain replies, streaming and not) plays 200
three-turn episodes against the trainer's loopback server with the tiny model; every engine request is logged,
and each recorded trajectory is checked against the log and against the messages the program sent.
"""

import concurrent.futures
from contextlib import aclosing

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
torch = pytest.importorskip("torch")

from echo_rl.external.client import report  # noqa: E402
from echo_rl.external.runner import ExternalRunner  # noqa: E402
from echo_rl.types import ACTION, ENV_OUTPUT, TEMPLATE, WARNING  # noqa: E402
from tests.sampler_gap import sampled_logprob_gap  # noqa: E402

SAY = {"type": "function", "function": {"name": "say", "description": "Say a number.", "parameters": {
    "type": "object", "properties": {"number": {"type": "string", "description": "the number"}}}}}


def log_engine(runner):
    """Wrap the engine host's stream: every request's prompt, sampled ids and log-probs."""
    host = runner.server.app.state.engine_host
    real, records = host.stream, []

    async def logged(prompt_ids, **kw):
        rec = {"prompt": list(prompt_ids), "ids": [], "lps": kw.setdefault("logprobs", [])}
        records.append(rec)
        async with aclosing(real(prompt_ids, **kw)) as items:
            async for item in items:
                if isinstance(item, int):
                    rec["ids"].append(item)
                yield item

    host.stream = logged
    return records


def program(root, key, rid, i, sent):
    """One episode of a small agent; ``sent[rid]`` gets, per request, the messages it adds (role, text)."""
    base = f"{root}/rollout/{rid}/v1"
    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)
    tools = [SAY] if i % 2 else None
    messages = [{"role": "system", "content": "Count upwards."}, {"role": "user", "content": f"Start at {i}."}]
    sent[rid] = [list(messages)]
    for turn in range(3):
        if turn == 2 and i % 10 == 3:  # edits an earlier turn
            messages[1] = {"role": "user", "content": f"Start at {i + 1}."}
        if turn == 2 and i % 10 == 7:  # re-sends the history without its last reply
            messages = messages[:-2] + messages[-1:]
        kw = {"tools": tools} if tools else {}
        if i % 3 == 0:
            text, calls = "", {}
            for chunk in client.chat.completions.create(model="policy", messages=messages, max_tokens=8,
                                                        stream=True, **kw):
                d = chunk.choices[0].delta if chunk.choices else None
                text += (d.content or "") if d else ""
                for c in (d.tool_calls or []) if d else []:
                    entry = calls.setdefault(c.index, {"id": c.id, "type": "function",
                                                       "function": {"name": c.function.name, "arguments": ""}})
                    entry["function"]["arguments"] += c.function.arguments or ""
            msg = {"role": "assistant", "content": text or None, **({"tool_calls": list(calls.values())} if calls
                                                                      else {})}
        else:
            reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=8, **kw)
            msg = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(msg)
        if turn == 2:
            break
        if msg.get("tool_calls"):
            new = {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": f"You said it. {turn}"}
        elif turn == 1 and i % 4 == 1:
            new = {"role": "user", "content": "Error: no call.", "echo_rl_role": "warning"}
        else:
            new = {"role": "user", "content": f"Next number after {turn}, please."}
        messages.append(new)
        sent[rid].append([new])
    report(float(i % 2), task=f"start-{i % 5}", url=f"{base}/echo_rl/reward", key=key)


def test_200_episodes_are_token_exact(tiny):
    check_episodes(tiny, 200)


def test_a_template_with_its_own_tool_format(tiny_path):
    """Tools rendered by the template itself (Hermes' format, as Qwen2.5's): the recorder renders with them."""
    from echo_rl.models.local import LocalBackbone
    from tests.test_serve.test_serve_tool_calls import HERMES

    backbone = LocalBackbone(tiny_path, device="cpu", name="tiny")
    backbone.tokenizer.chat_template = HERMES
    check_episodes(backbone, 20)


def check_episodes(tiny, episodes):
    sent = {}
    with ExternalRunner(tiny, ["true"], concurrency=16) as runner:
        records = log_engine(runner)
        rids = [f"ep{i}" for i in range(episodes)]
        for rid in rids:
            runner.recorder.start(rid)
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: program(runner.root, runner.key, rids[i], i, sent), range(episodes)))
        finished = [runner.recorder.finish(rid) for rid in rids]
        counts = dict(runner.recorder.counts)
    by_prompt = {}
    for r in records:
        by_prompt.setdefault(tuple(r["prompt"]), []).append(r)
    decode = tiny.tokenizer.decode
    mismatches = turns = warned = 0
    trajs = []
    for (ep, ts), rid in zip(finished, rids):
        assert ep.reward is not None and ts
        trajs += ts
        for t in ts:
            ids, lps, roles, spans = t.token_ids, t.behavior_logprobs, t.roles, t.turn_spans()
            assert all(r != ACTION for r in roles[:t.prompt_length])
            for k, (a, b) in enumerate(spans):
                turns += 1
                cands = by_prompt.get(tuple(ids[:a]), [])  # the context sampled from is the trained prefix
                ok = [r for r in cands if r["ids"][:b - a] == ids[a:b] and r["lps"][:b - a] == lps[a:b]
                      and (b - a == len(r["ids"]) or "</say>" in decode(ids[a:b]))]
                mismatches += not ok
                if ep.splits == 0 and k + 1 < len(spans):  # what follows a reply: the program's next messages
                    between = list(zip(ids[b:spans[k + 1][0]], roles[b:spans[k + 1][0]]))
                    body = decode([i for i, r in between if r in (ENV_OUTPUT, WARNING)])
                    mismatches += body != "".join(m["content"] for m in sent[rid][k + 1])
                    mismatches += any(r not in (TEMPLATE, ENV_OUTPUT, WARNING) for _, r in between)
                    warned += any(r == WARNING for _, r in between)
    splits = sum(ep.splits for ep, _ in finished)
    assert mismatches == 0
    assert splits == counts["splits"] == episodes // 10 * 2  # every editing / re-sending episode, once
    assert turns == 3 * episodes and warned >= 1 and counts.get("conflicts", 0) == 0, (turns, warned, counts)
    assert {t.info["task"] for t in trajs} == {f"start-{k}" for k in range(5)}
    assert all(len(t.info["anchor_states"]) == t.num_turns for t in trajs)

    gap, sampled = sampled_logprob_gap(tiny.model, trajs)  # the learner's log-probs are the sampler's
    print(f"{episodes} episodes, {turns} turns, {splits} splits, {sampled} sampled tokens, "
          f"max |log-prob gap| {gap:.2e}, {mismatches} mismatches")
    assert gap < 1e-3
