"""Tool calling in `echo-rl serve`, through the official openai client against the real server on loopback.

The engine's sampler is replaced by a script (the tokens of a fixed reply, then EOS) that also records the
prompt it was given, so replies are deterministic and the rendered prompt can be checked token for token;
everything between (rendering, stop strings, parsing, SSE) is the real server's.
"""

import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from echo_rl.environments.tool_calls import BASH, SUBMIT, format_instruction  # noqa: E402
from echo_rl.models.local import LocalBackbone  # noqa: E402
from echo_rl.serve import ModelServer, create_app  # noqa: E402
from echo_rl.serve.engine_host import Generated  # noqa: E402
from echo_rl.serve.stream_text import StreamText  # noqa: E402

TOOLS = [BASH.schema(), SUBMIT.schema()]
MSGS = [{"role": "system", "content": "You are in a terminal."}, {"role": "user", "content": "list the files"}]
# ChatML with a tool format of its own (Hermes' <tool_call> blocks, as Qwen2.5's template has)
HERMES = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>"
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- elif m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{{ m.content or '' }}"
    "{% for c in m.tool_calls %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class Script:
    """Stands in for the engine's sampler: yields the tokens of ``reply`` then EOS, recording each prompt."""

    def __init__(self, backbone, host):
        self.backbone, self.eos, self.reply, self.prompts = backbone, host.stop_ids[0], "", []

    async def stream(self, prompt_ids, *, max_tokens, temperature, top_p, seed):
        self.prompts.append(list(prompt_ids))
        ids = self.backbone.encode(self.reply)[:max_tokens]
        for t in ids:
            yield t
        yield self.eos
        yield Generated(ids + [self.eos], "stop")

    def prompt_text(self) -> str:
        return self.backbone.tokenizer.decode(self.prompts[-1])


def serve(backbone):
    srv = ModelServer(create_app(backbone, model_name="tiny")).start()
    host = srv.app.state.engine_host
    script = Script(backbone, host)
    host.stream = script.stream
    return srv, script, openai.OpenAI(base_url=srv.url, api_key="EMPTY", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def text_server(tiny):  # the tiny model's template is plain ChatML: no tool format, so the text format
    srv, script, client = serve(tiny)
    yield script, client
    srv.stop()


@pytest.fixture(scope="module")
def template_server(tiny_path):
    backbone = LocalBackbone(tiny_path, device="cpu", name="tiny")
    backbone.tokenizer.chat_template = HERMES
    srv, script, client = serve(backbone)
    yield script, client
    srv.stop()


def chat(client, **kw):
    return client.chat.completions.create(model="tiny", max_tokens=256, temperature=0, **kw)


def streamed(client, **kw):
    """(content, {index: {id, name, arguments}}, finish_reason) reassembled from a stream's chunks."""
    content, calls, finish = [], {}, None
    for chunk in chat(client, stream=True, **kw):
        for c in chunk.choices:
            content.append(c.delta.content or "")
            assert not (c.delta.content or "").count("<bash"), "text of a tool call was streamed as content"
            for tc in c.delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    assert call["id"] is None and not call["arguments"], "the id and name come first, once"
                    call["id"], call["name"] = tc.id, tc.function.name
                call["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    return "".join(content), calls, finish


def test_a_text_format_call_becomes_tool_calls(text_server, tiny):
    script, client = text_server
    script.reply = "Let me look.\n<bash>ls -la</bash> and then I will submit"
    resp = chat(client, messages=MSGS, tools=TOOLS)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look.\n"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "bash"
    assert json.loads(call.function.arguments) == {"command": "ls -la"}
    # the closing tag is a stop string: nothing after it was taken
    assert resp.usage.completion_tokens == len(tiny.encode("Let me look.\n<bash>ls -la</bash>"))
    # the tools were offered in the documented text format, in the system turn
    system = {"role": "system", "content": f"You are in a terminal.\n{format_instruction((BASH, SUBMIT))}"}
    assert script.prompts[-1] == tiny.chat_prompt_ids([system, MSGS[1]])


def test_a_streamed_call_arrives_as_tool_call_deltas(text_server):
    script, client = text_server
    script.reply = "Let me look.\n<bash>ls -la</bash> and then I will submit"
    content, calls, finish = streamed(client, messages=MSGS, tools=TOOLS)
    assert content == "Let me look.\n" and finish == "tool_calls"
    assert list(calls) == [0] and calls[0]["name"] == "bash" and calls[0]["id"].startswith("call_")
    assert json.loads(calls[0]["arguments"]) == {"command": "ls -la"}


def test_a_conversation_with_a_tool_result(text_server, tiny):
    script, client = text_server
    script.reply = "<bash>ls -la</bash>"
    first = chat(client, messages=MSGS, tools=TOOLS).choices[0].message
    history = MSGS + [first.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "notes.txt"}]
    script.reply = "<submit>notes.txt</submit>"
    resp = chat(client, messages=history, tools=TOOLS)
    assert resp.choices[0].message.tool_calls[0].function.name == "submit"
    assert json.loads(resp.choices[0].message.tool_calls[0].function.arguments) == {"answer": "notes.txt"}
    # the call went back in as its text-format tag, the result as a user turn (ChatML here has no tool role)
    system = {"role": "system", "content": f"You are in a terminal.\n{format_instruction((BASH, SUBMIT))}"}
    want = [system, MSGS[1], {"role": "assistant", "content": "<bash>ls -la</bash>"},
            {"role": "user", "content": "notes.txt"}]
    assert script.prompts[-1] == tiny.chat_prompt_ids(want)


def test_tool_choice_none_offers_no_tools(text_server, tiny):
    script, client = text_server
    script.reply = "<bash>ls</bash> is what I would run"
    resp = chat(client, messages=MSGS, tools=TOOLS, tool_choice="none")
    choice = resp.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert choice.message.content == script.reply  # no closing-tag stop either
    assert script.prompts[-1] == tiny.chat_prompt_ids(MSGS)


def test_a_named_function_is_forced(text_server):
    script, client = text_server
    script.reply = "42</submit>"  # the model continues the opening tag the prompt ends with
    named = {"type": "function", "function": {"name": "submit"}}
    resp = chat(client, messages=MSGS, tools=TOOLS, tool_choice=named)
    assert script.prompt_text().endswith("<|im_start|>assistant\n<submit>")
    (call,) = resp.choices[0].message.tool_calls
    assert call.function.name == "submit" and json.loads(call.function.arguments) == {"answer": "42"}
    assert resp.choices[0].message.content is None and resp.choices[0].finish_reason == "tool_calls"
    content, calls, finish = streamed(client, messages=MSGS, tools=TOOLS, tool_choice=named)
    assert content == "" and calls[0]["name"] == "submit" and finish == "tool_calls"
    # a reply that never closes the call is returned as the text written, with its own finish reason
    script.reply = "42, I think"
    resp = chat(client, messages=MSGS, tools=TOOLS, tool_choice=named)
    assert resp.choices[0].message.tool_calls is None and resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.content == "<submit>42, I think"
    content, calls, finish = streamed(client, messages=MSGS, tools=TOOLS, tool_choice=named)
    assert (content, calls, finish) == ("<submit>42, I think", {}, "stop")


def test_a_reply_without_a_call_is_plain_text(text_server):
    script, client = text_server
    script.reply = "I am not sure what to do <"
    resp = chat(client, messages=MSGS, tools=TOOLS)
    assert resp.choices[0].message.content == script.reply and resp.choices[0].message.tool_calls is None
    assert resp.choices[0].finish_reason == "stop"
    assert streamed(client, messages=MSGS, tools=TOOLS) == (script.reply, {}, "stop")


FN = {"name": "run", "description": "d", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}


@pytest.mark.parametrize("tools,extra,words", [
    ([{"type": "retrieval", "function": FN}], {}, "tools.0.type"),
    ([{"type": "function", "function": {**FN, "name": "rm -rf"}}], {}, "tools.0.function.name"),
    ([{"type": "function", "function": {**FN, "parameters": {"type": "array"}}}], {}, "type object"),
    ([{"type": "function", "function": {**FN, "parameters": {"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "string"}}}}}], {}, "one string argument per tool"),
    ([{"type": "function", "function": {**FN, "parameters": {"type": "object", "properties": {
        "n": {"type": "integer"}}}}}], {}, "of type 'integer'"),
    ([{"type": "function", "function": {**FN, "name": "Run"}}], {}, "[a-z][a-z0-9_]"),
    ([{"type": "function", "function": FN}, {"type": "function", "function": FN}], {}, "names repeat"),
    ([{"type": "function", "function": FN}], {"tool_choice": {"type": "function", "function": {"name": "ls"}}},
     "tool_choice.function.name='ls' is not in tools"),
    (None, {"tool_choice": "auto"}, "tool_choice needs tools"),
    ([{"type": "function", "function": FN}], {"messages": MSGS + [{"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}] * 2}]},
     "one call per assistant turn"),
    ([{"type": "function", "function": FN}], {"messages": MSGS + [{"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "nope", "arguments": "{}"}}]}]}, "unknown tool"),
    ([{"type": "function", "function": FN}], {"messages": MSGS + [{"role": "tool", "content": "x"}]},
     "tool_call_id"),
    (None, {"messages": MSGS + [{"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "run", "arguments": "{}"}}]}]}, "pass the tools"),
])
def test_bad_tools_are_one_line_400s(text_server, tools, extra, words):
    _, client = text_server
    kw = {"messages": MSGS, **extra}
    if tools is not None:
        kw["tools"] = tools
    with pytest.raises(openai.BadRequestError) as exc:
        chat(client, **kw)
    msg = exc.value.body["message"]
    assert words in msg and "\n" not in msg, msg


def test_a_template_with_a_tool_format_renders_and_parses_its_own(template_server, tiny):
    script, client = template_server
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
    script.reply = 'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>'
    resp = chat(client, messages=MSGS, tools=[weather])
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"city": "Paris", "days": 2}
    assert json.dumps(weather) in script.prompt_text()  # the template got the schema, not the text format
    assert "Reply with exactly one tool call" not in script.prompt_text()
    content, calls, finish = streamed(client, messages=MSGS, tools=[weather])
    assert (content, finish) == ("Checking.", "tool_calls") and calls[0]["name"] == "get_weather"
    # history: the call (arguments as an object) and the result go through the template's own tool turns
    history = MSGS + [choice.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "sunny"}]
    script.reply = "It will be sunny."
    resp = chat(client, messages=history, tools=[weather])
    assert resp.choices[0].message.content == "It will be sunny." and resp.choices[0].finish_reason == "stop"
    text = script.prompt_text()
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>' in text
    assert "<tool_response>sunny</tool_response>" in text
    # a named function the reply does not call: the text, with its own finish reason
    script.reply = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'
    other = {"type": "function", "function": {**weather["function"], "name": "get_time"}}
    resp = chat(client, messages=MSGS, tools=[weather, other],
                tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert resp.choices[0].message.content == script.reply and resp.choices[0].finish_reason == "stop"


class Pieces:
    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_a_kept_stop_string_ends_the_text_and_stays_in_it():
    st = StreamText(Pieces(["<bash>ls</ba", "sh> rm", " -rf"]), ["STOP"], keep=["</bash>"])
    assert st.push(0) == "<bash>ls" and st.push(1) == "</bash>" and st.stopped and st.used == 2
    assert st.push(2) == "" and st.text[:st.sent] == "<bash>ls</bash>"


def test_real_decoding_with_a_forced_call_streams_what_it_returns(tiny):
    """No script: the engine samples after the forced opening tag; the stream (text held, log-probs carried)
    reassembles to the non-streamed reply."""
    with ModelServer(create_app(tiny, model_name="tiny")) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="EMPTY", max_retries=0, timeout=60)
        kw = dict(model="tiny", messages=MSGS, tools=TOOLS, max_tokens=12, temperature=0, logprobs=True,
                  tool_choice={"type": "function", "function": {"name": "bash"}})
        full = client.chat.completions.create(**kw).choices[0]
        text, lps, finish = [], [], None
        for chunk in client.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                text.append(c.delta.content or "")
                lps += c.logprobs.content if c.logprobs and c.logprobs.content else []
                finish = c.finish_reason or finish
    assert full.message.content.startswith("<bash>") and full.finish_reason == finish
    assert "".join(text) == full.message.content
    assert [t.token for t in lps] == [t.token for t in full.logprobs.content] and len(lps) >= 1
    # scored piece by piece vs at once: the same numbers up to float rounding of different forward shapes
    assert [t.logprob for t in lps] == pytest.approx([t.logprob for t in full.logprobs.content], abs=1e-4)
