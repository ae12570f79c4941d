"""Role masks by delta rendering, on a ChatML and a Llama-3-style template."""

import re

import pytest

from echo_rl.lm.chat_delta import ChatRenderer, TemplatePrefixError, check_prefix_preserving
from echo_rl.lm.trajectory import TrajectoryBuilder
from echo_rl.types import ACTION, ENV_OUTPUT, ROLE_NAMES, TEMPLATE, WARNING

FIRST = [("env_output", "You are in a room. You see a key 1 and a door 1.")]
TURNS = [("take key 1", [("warning", "Nothing happens. "), ("env_output", "You see a door 1.\n")], 0.0),
         ("open door 1", [("env_output", "The door is locked.")], 0.0),
         ("go to door 1", [("warning", "Unknown action; use one of: turn left, turn right.")], 0.5)]


def _episode(renderer, actions=None):
    b = TrajectoryBuilder(renderer, FIRST, system="You are an agent in a text world.", group_id=3, episode_id=7)
    sampled = []
    for k, (text, segs, reward) in enumerate(TURNS):
        ids = actions[k] if actions else renderer.encode(text)
        sampled.append(ids)
        b.add_action(ids, [-0.25] * len(ids))
        b.add_observation(segs, reward)
    b.add_action(renderer.encode("take key 1"), [-0.1] * len(renderer.encode("take key 1")))
    return b, b.finish(reward=1.0, won=True), sampled


def _body_text(tok, traj, role, lo, hi):
    return tok.decode([t for t, r in zip(traj.token_ids[lo:hi], traj.roles[lo:hi]) if r == role])


def test_tokens_equal_the_rendered_conversation(tokenizer):
    """With canonical action tokens, appending deltas reproduces rendering the whole chat at once."""
    r = ChatRenderer(tokenizer)
    b, traj, _ = _episode(r)
    assert traj.token_ids == r.encode(r.render(b.history, add_generation_prompt=False))
    assert traj.rewards == [0.0, 0.0, 0.5, 1.0] and traj.num_turns == 4
    assert traj.group_id == 3 and traj.episode_id == 7 and traj.info == {"won": True}


def test_roles_spans_monotone_and_covering(tokenizer):
    r = ChatRenderer(tokenizer)
    _, traj, _ = _episode(r)
    assert len(traj.roles) == len(traj.token_ids)
    letters = "".join("TAEW"[x] for x in traj.roles[traj.prompt_length:])
    # response = (actions, then one observation: wrappers, warning body, env body, wrappers) per turn
    assert re.fullmatch(r"(A+T*(W*E*)T*)+", letters), letters
    for seg in re.findall(r"T+[WE]+T+", letters):
        assert re.fullmatch(r"T+W*E*T+", seg), seg
    spans = traj.turn_spans()
    assert len(spans) == 4 and all(a < b for a, b in spans)
    assert [tokenizer.decode(traj.token_ids[a:b]) for a, b in spans] == [t for t, _, _ in TURNS] + ["take key 1"]


def test_observation_bodies_decode_to_their_segments(tokenizer):
    r = ChatRenderer(tokenizer)
    _, traj, _ = _episode(r)
    spans = traj.turn_spans()
    bodies = [(spans[k][1], spans[k + 1][0]) for k in range(3)]
    trim = "llama3" if "eot_id" in tokenizer.chat_template else "chatml"
    for (lo, hi), (_, segs, _) in zip(bodies, TURNS):
        warn = "".join(t for role, t in segs if role == "warning")
        env = "".join(t for role, t in segs if role == "env_output")
        got_w, got_e = _body_text(tokenizer, traj, WARNING, lo, hi), _body_text(tokenizer, traj, ENV_OUTPUT, lo, hi)
        if trim == "llama3":  # the template trims the content
            assert (got_w + got_e) == (warn + env).strip()
        else:
            assert got_w + got_e == warn + env
        # a straddling token (" You") goes to the text it completes: the env output keeps its words
        assert got_w.strip() == warn.strip()
    counts = traj.role_counts()
    assert traj.env_output_count == counts["env_output"] + counts["warning"] > 0
    assert counts["action"] == sum(b - a for a, b in spans)
    # the first observation is in the prompt, not in |O|
    prompt_roles = traj.roles[:traj.prompt_length]
    assert ENV_OUTPUT in prompt_roles and ACTION not in prompt_roles
    assert tokenizer.decode([t for t, x in zip(traj.token_ids, prompt_roles) if x == ENV_OUTPUT]) == FIRST[0][1]


def test_sampled_tokens_are_kept_as_sampled(tokenizer):
    """Non-canonical ids (one token per character) stay exactly as sampled — no re-tokenization."""
    r = ChatRenderer(tokenizer)
    chars = [[tokenizer.convert_tokens_to_ids(c if c != " " else "Ġ") for c in text] for text, _, _ in TURNS]
    assert all(r.encode(t) != ids for (t, _, _), ids in zip(TURNS, chars))
    _, traj, sampled = _episode(r, actions=chars)
    spans = traj.turn_spans()
    assert [traj.token_ids[a:b] for a, b in spans[:3]] == sampled
    assert all(traj.behavior_logprobs[i] == -0.25 for a, b in spans[:3] for i in range(a, b))
    assert all(traj.behavior_logprobs[i] == 0.0 for i, x in enumerate(traj.roles) if x != ACTION)


def test_eos_sampled_by_the_model_is_not_doubled(chatml_tokenizer):
    r = ChatRenderer(chatml_tokenizer)
    b = TrajectoryBuilder(r, FIRST)
    ids = r.encode("take key 1") + [chatml_tokenizer.convert_tokens_to_ids("<|im_end|>")]
    b.add_action(ids, [-0.3] * len(ids))
    traj = b.finish(reward=0.0)
    assert traj.token_ids[traj.prompt_length:] == ids + r.encode("\n")
    assert [ROLE_NAMES[x] for x in traj.roles[-2:]] == ["action", "template"]


def test_prefix_check_passes_on_good_templates(tokenizer):
    check_prefix_preserving(ChatRenderer(tokenizer))


def test_prefix_check_names_the_first_divergence(chatml_tokenizer, forgetful_template):
    r = ChatRenderer(chatml_tokenizer, chat_template=forgetful_template)
    with pytest.raises(TemplatePrefixError, match="does not keep earlier turns as a prefix.*character"):
        check_prefix_preserving(r)
    b = TrajectoryBuilder(r, FIRST)
    ids = r.encode("take key 1")
    b.add_action(ids, [-0.1] * len(ids))
    with pytest.raises(TemplatePrefixError):
        b.add_observation([("env_output", "ok")], 0.0)


def test_bad_input_is_one_clear_error(chatml_tokenizer):
    r = ChatRenderer(chatml_tokenizer)
    with pytest.raises(ValueError, match="role='observation' is invalid"):
        TrajectoryBuilder(r, [("observation", "x")])
    b = TrajectoryBuilder(r, FIRST)
    with pytest.raises(ValueError, match="equal length"):
        b.add_action([1, 2], [-0.1])
    with pytest.raises(ValueError, match="log-probabilities"):
        b.add_action([1], [0.5])
    b.add_action([5], [-0.1])
    with pytest.raises(ValueError, match="no reward"):
        b.finish()
    assert TEMPLATE == 0


def test_long_observations_are_cut_to_the_cap_warning_first(tokenizer):
    r = ChatRenderer(tokenizer)
    b = TrajectoryBuilder(r, FIRST, max_observation_tokens=12)
    ids = r.encode("take key 1")
    b.add_action(ids, [-0.1] * len(ids))
    b.add_observation([("env_output", "You see a door 1. " * 20), ("warning", "Nothing happens.")], 0.0)
    traj = b.finish()
    assert 0 < traj.env_output_count <= 12 and b.truncated_observations >= 1
    body = [t for t, x in zip(traj.token_ids[traj.prompt_length:], traj.roles[traj.prompt_length:]) if x == WARNING]
    assert tokenizer.decode(body).strip() == "Nothing happens."  # the warning survives, kept first
    assert b.history[-1]["content"].startswith("Nothing happens.You see a door")
    with pytest.raises(ValueError, match="max_observation_tokens=0 is invalid"):
        TrajectoryBuilder(r, FIRST, max_observation_tokens=0)
