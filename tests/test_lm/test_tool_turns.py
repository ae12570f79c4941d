"""Tool calls in the LM path, token-in/token-out: what is trained is exactly what was sampled plus what was rendered.

The task is ``tests/tool_env.py`` (one env file plus its spec). A tiny model is
warm-started on the env's expert so it writes real ``<bash>`` / ``<submit>``
calls; then 200 multi-turn rollouts run through the engine, every ``generate``
call recorded, and each trajectory is checked against the record.
"""

import asyncio
import contextvars

import pytest
import torch

transformers = pytest.importorskip("transformers")

from echo_rl.config import ExecutionConfig, LMConfig  # noqa: E402
from echo_rl.engine.engine import AsyncExecutionEngine  # noqa: E402
from echo_rl.environments import registry  # noqa: E402
from echo_rl.environments.registry import task_format  # noqa: E402
from echo_rl.lm.chat_delta import ChatRenderer  # noqa: E402
from echo_rl.lm.learner import LMLearner  # noqa: E402
from echo_rl.lm.rollout import LMRolloutWorker  # noqa: E402
from echo_rl.lm.sft import expert_trajectory  # noqa: E402
from echo_rl.types import ENV_OUTPUT, TEMPLATE, WARNING  # noqa: E402
from test_rollout_e2e import _model  # noqa: E402
from tests.sampler_gap import sampled_logprob_gap  # noqa: E402
from tests.tool_env import SPEC, NotesEnv  # noqa: E402

STEPS = 20  # warm-start steps: enough for the tiny model to write real calls most turns

TOOL_CHATML = ("{% for message in messages %}"
               "{% if message['role'] == 'tool' %}{{ '<|im_start|>tool\n' + message['content'] + '<|im_end|>\n' }}"
               "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
               "{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture
def notes_task():
    registry.register_task(SPEC)
    yield SPEC.name
    registry._TASKS.pop(SPEC.name, None)


def _tool_tokenizer():
    """A ChatML tokenizer that knows the tool tags and the task's words, so episodes are short."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    env = NotesEnv()
    corpus = []
    for seed in range(30):
        _, info = env.reset(seed=seed)
        corpus.append(info["segments"][0].text)
        while not env._done:
            action = env.expert_action()
            obs = env.step(action)[0]
            corpus += [action, obs, "<bash>cat x</bash> <submit>1</submit>"]
    corpus += ["no tool call found: reply with <bash>COMMAND</bash> or <submit>ANSWER</submit>",
               "the bash call is not closed: end it with </bash>", "the submit call is not closed"] * 5
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(corpus, trainer=trainers.BpeTrainer(
        vocab_size=500, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", additional_special_tokens=specials[:2])
    tok.chat_template = TOOL_CHATML.replace("'<|im_start|>tool", "'<|im_start|>user")  # no tool role: plain ChatML
    return tok


def test_tool_role_only_where_the_template_has_it(chatml_tokenizer, notes_task):
    plain = ChatRenderer(chatml_tokenizer)
    tooled = ChatRenderer(chatml_tokenizer, chat_template=TOOL_CHATML)
    assert not plain.has_tool_role and tooled.has_tool_role and not tooled.accepts_tools
    fmt = task_format(notes_task)
    assert fmt.parser == "tool_call" and fmt.observation_role == "tool" and fmt.stop == ("</bash>", "</submit>")
    demo = expert_trajectory(NotesEnv(), tooled, seed=3, task=notes_task)
    text = chatml_tokenizer.decode(demo.token_ids)
    assert "<|im_start|>tool\n" in text and "<bash>ls</bash><|im_end|>" in text and demo.info["won"]
    assert "<bash>COMMAND</bash>" in text  # the text format joins the system prompt
    plain_text = chatml_tokenizer.decode(expert_trajectory(NotesEnv(), plain, seed=3, task=notes_task).token_ids)
    assert "<|im_start|>tool" not in plain_text and plain_text.count("<|im_start|>user") == 4


def test_unparsable_reply_is_a_warning_and_never_a_command(notes_task):
    fmt = task_format(notes_task)
    env = NotesEnv()
    env.reset(seed=0)
    reply = "let me look\n<bash>ls"  # cut off before its closing tag
    assert fmt.action(reply) == reply
    obs, reward, done, _, info = env.step(fmt.action(reply))
    assert [s.role for s in info["segments"]] == ["warning"] and "not closed" in obs and not done
    assert fmt.action("I will list.\n<bash>ls</bash> and then") == "<bash>ls</bash>"
    assert "ls" not in env.seen


def _warm_start(tokenizer, model, task):
    renderer = ChatRenderer(tokenizer)
    demos = [expert_trajectory(NotesEnv(), renderer, seed=s, task=task, system="") for s in range(8)]
    learner = LMLearner(model, pad_id=0, config=LMConfig(learning_rate=1e-2))
    for _ in range(STEPS):
        learner.sft_update(demos)
    model.eval()
    return renderer


def test_200_rollouts_train_on_exactly_the_sampled_and_rendered_tokens(notes_task):
    tokenizer = _tool_tokenizer()
    model = _model(len(tokenizer))
    renderer = _warm_start(tokenizer, model, notes_task)
    fmt = task_format(notes_task)
    episode = contextvars.ContextVar("episode")
    calls: dict[int, list] = {}
    sent: dict[int, list] = {}

    class Recording:  # the engine, with every generate call kept per episode
        def __init__(self, engine):
            self._engine = engine

        def __getattr__(self, name):
            return getattr(self._engine, name)

        async def generate(self, prompt_ids, **kw):
            res = await self._engine.generate(prompt_ids, **kw)
            calls.setdefault(episode.get(), []).append((list(prompt_ids), res))
            return res

    class Logged(NotesEnv):  # the env, with every action and observation it answered kept
        def step(self, action):
            out = super().step(action)
            sent.setdefault(episode.get(), []).append((action, out[0], [s.role for s in out[4]["segments"]]))
            return out

    async def run():
        async with AsyncExecutionEngine(ExecutionConfig(), model) as engine:
            worker = LMRolloutWorker(Recording(engine), renderer,
                                     LMConfig(max_turns=4, temperature=1.0, system_prompt=""), task=notes_task)

            async def one(i):
                episode.set(i)
                return await worker.episode(Logged(), seed=i, episode_id=i)

            return await asyncio.gather(*[one(i) for i in range(200)])

    trajs = asyncio.run(run())
    mismatches = turns = valid = warned = multi = 0
    decode = tokenizer.decode
    for i, t in enumerate(trajs):
        spans, ids, lps = t.turn_spans(), t.token_ids, t.behavior_logprobs
        multi += len(spans) > 1
        assert len(spans) == len(calls[i]) == len(sent[i])
        for k, ((prompt, res), (a, b), (action, obs, roles)) in enumerate(zip(calls[i], spans, sent[i])):
            turns += 1
            kept = res.token_ids[:b - a]
            reply = decode(kept, skip_special_tokens=True)
            cut_ok = b - a == len(res.token_ids) or (any(s in reply for s in fmt.stop) and not any(
                s in decode(kept[:-1], skip_special_tokens=True) for s in fmt.stop))
            mismatches += prompt != ids[:a]  # the context sampled from is the trained prefix, token for token
            mismatches += ids[a:b] != kept or lps[a:b] != list(res.logprobs[:b - a]) or not cut_ok
            mismatches += action != fmt.action(reply)
            nxt = spans[k + 1][0] if k + 1 < len(spans) else len(ids)
            body = [tok for tok, r in zip(ids[b:nxt], t.roles[b:nxt]) if r in (ENV_OUTPUT, WARNING)]
            mismatches += decode(body) != obs or any(r not in (TEMPLATE, ENV_OUTPUT, WARNING)
                                                     for r in t.roles[b:nxt])
            valid += roles == ["env_output"]
            warned += roles == ["warning"]
    assert mismatches == 0
    assert turns >= 400 and multi >= 100 and valid >= 100 and warned >= 1, (turns, multi, valid, warned)

    gap, sampled = sampled_logprob_gap(model, trajs)  # fp32: the learner's log-probs are the sampler's
    print(f"200 rollouts: {turns} turns, {valid} answered by the env, {warned} warnings, "
          f"{sampled} sampled tokens, max |log-prob gap| {gap:.2e}, {mismatches} mismatches")
    assert gap < 1e-3


def test_a_tool_use_task_trains_through_the_trainer(notes_task, chatml_tokenizer, tmp_path):
    """The task is only its env file and spec: SFT demos, rollouts and the held-out pool all follow its protocol."""
    from echo_rl.lm.loop import LMAgent
    from echo_rl.training.trainer import EchoRLTrainer
    from tests.test_lm.test_loop import _cfg, save_checkpoint

    cfg = _cfg(save_checkpoint(tmp_path / "ckpt", chatml_tokenizer), env_name=notes_task, total_timesteps=100,
               **{"lm_config.max_updates": 1, "lm_config.max_new_tokens": 8})
    pool = LMAgent(cfg, torch.device("cpu")).heldout_pool()
    text = chatml_tokenizer.decode(pool[0].token_ids)
    assert "<bash>COMMAND</bash>" in text and "<bash>ls</bash><|im_end|>" in text
    result = asyncio.run(EchoRLTrainer(cfg, tmp_path / "run", show_progress=False).train())
    assert result.num_updates == 1 and "heldout_env_ce" in result.evaluation_results
