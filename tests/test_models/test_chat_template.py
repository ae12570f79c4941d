"""Chat templates from disk render under limits: same text as transformers, hostile ones fail alone."""

import pytest

transformers = pytest.importorskip("transformers")

from echo_rl.models import chat_template as ct  # noqa: E402
from echo_rl.models.chat_template import TemplateError, TemplateLimitError, apply_chat_template  # noqa: E402

MESSAGES = [{"role": "system", "content": "You are in a room."}, {"role": "user", "content": "go north"},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "look", "name": None}]
LOOPS = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}x"
DOUBLING = ("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(48) %}{% set ns.s = ns.s ~ ns.s %}"
            "{% endfor %}{{ ns.s }}")


@pytest.fixture(scope="module")
def tokenizer(tiny_path):
    return transformers.AutoTokenizer.from_pretrained(str(tiny_path))


@pytest.mark.parametrize("gen", [True, False])
def test_the_text_is_what_transformers_renders(tokenizer, gen):
    want = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=gen)
    assert apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=gen) == want


def test_nested_loops_are_stopped_at_the_time_limit(tokenizer, monkeypatch):
    monkeypatch.setattr(ct, "RENDER_TIMEOUT_S", 1.0)
    with pytest.raises(TemplateLimitError, match="did not finish rendering within 1 s"):
        apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=True, chat_template=LOOPS)
    assert apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=True)  # a fresh renderer serves on


@pytest.mark.parametrize("template", [DOUBLING, "{{ 'a' * 3000000000 }}"])
def test_a_memory_bomb_fails_in_its_renderer_not_here(tokenizer, template):
    with pytest.raises(TemplateLimitError, match="memory limit"):  # a long time limit: on a loaded box the
        apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=True,  # copies take seconds, and this
                            chat_template=template, timeout=120.0)  # test is about the memory limit
    assert apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=True)


def test_output_over_the_size_cap_fails(tokenizer, monkeypatch):
    monkeypatch.setattr(ct, "MAX_RENDER_CHARS", 1000)
    with pytest.raises(TemplateLimitError, match="rendered 5,000 characters; the limit is 1,000"):
        apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=True, chat_template="{{ 'ab' * 2500 }}")


def test_a_template_error_is_one_line_and_not_a_limit(tokenizer):
    with pytest.raises(TemplateError, match="only user roles") as info:
        apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=True,
                            chat_template="{{ raise_exception('only user roles\\nsecond line') }}")
    assert not isinstance(info.value, TemplateLimitError) and "\n" not in str(info.value)


def test_sandbox_escapes_stay_refused(tokenizer):
    with pytest.raises(TemplateError, match="SecurityError|unsafe|undefined"):
        apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=True,
                            chat_template="{{ ''.__class__.__mro__[1].__subclasses__() }}")


def test_requests_waiting_for_a_renderer_get_one_after_a_hostile_render(tokenizer, monkeypatch):
    """With one process and a hostile render holding it, a waiting render gets the replacement process."""
    import threading

    monkeypatch.setattr(ct, "RENDER_TIMEOUT_S", 1.0)
    monkeypatch.setattr(ct, "_POOL", ct.TemplatePool(workers=1))
    errors, texts = [], []

    def hostile():
        try:
            apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=True, chat_template=LOOPS)
        except TemplateLimitError as exc:
            errors.append(exc)

    apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=True)  # the one process is started
    t = threading.Thread(target=hostile)
    t.start()
    while ct._POOL._idle.qsize():  # the hostile render holds the process
        pass
    texts.append(apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=True))
    t.join()
    ct._POOL.close()
    assert len(errors) == 1 and texts[0].startswith("<|im_start|>system")
