"""A run or model directory's hostile chat template fails its request with one line; the server serves on."""

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from echo_rl.models import chat_template as ct  # noqa: E402
from echo_rl.models.local import LocalBackbone  # noqa: E402
from echo_rl.serve import ModelServer, create_app  # noqa: E402

CHAT = "/v1/chat/completions"
HOSTILE = {
    "loops": "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}x",
    "doubling": "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(48) %}{% set ns.s = ns.s ~ ns.s %}"
                "{% endfor %}{{ ns.s }}",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_template_fails_its_request_not_the_server(tiny_path, kind, monkeypatch):
    monkeypatch.setattr(ct, "RENDER_TIMEOUT_S", 1.0)
    backbone = LocalBackbone(tiny_path, device="cpu", name="tiny")
    good = backbone.tokenizer.chat_template
    backbone.tokenizer.chat_template = HOSTILE[kind]  # as if read from the directory
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with ModelServer(create_app(backbone, model_name="tiny")) as srv, \
            httpx.Client(base_url=f"http://{srv.host}:{srv.port}", timeout=120) as http:
        r = http.post(CHAT, json=body)
        assert r.status_code == 500, r.text[:300]
        err = r.json()["error"]
        assert err["code"] == "chat_template_limit" and "\n" not in err["message"]
        assert "chat template" in err["message"]
        assert http.get("/health").status_code == 200
        backbone.tokenizer.chat_template = good
        assert http.post(CHAT, json=body).status_code == 200  # the same server, a sane template: served
