"""``echo_rl.agents`` is a promised import path: a thin re-export of the prompting baselines' room."""

import echo_rl.agents as agents
import echo_rl.prompting as prompting


def test_echo_rl_agents_re_exports_every_prompting_name():
    assert agents.__all__ == prompting.__all__
    for name in prompting.__all__:
        assert getattr(agents, name) is getattr(prompting, name)


def test_the_documented_imports_still_work():
    from echo_rl.agents import ReActAgent, TreeOfThoughtsAgent, evaluate_text_agent

    assert ReActAgent.__module__ == "echo_rl.prompting.react"
    assert TreeOfThoughtsAgent.__module__ == "echo_rl.prompting.tot"
    assert evaluate_text_agent.__module__ == "echo_rl.prompting.runner"
