"""A chat-template rendering process: started only by ``echo_rl.models.chat_template``, never imported.

A chat template read from a model or run directory is a program (jinja2). It
runs here, in transformers' own sandboxed jinja environment, under an address
space limit, so a template that loops forever can be killed by the host and
one that doubles a string until memory runs out fails here, not in the host.

Protocol, one JSON object per line. On start: ``{"ready": true}``. Request:
``{"conversation", "chat_template", "add_generation_prompt", "kwargs",
"max_chars"}``; reply ``{"text"}`` or ``{"error"}`` (one line).
"""

import json
import resource
import sys


def main() -> None:
    memory = int(sys.argv[sys.argv.index("--memory-bytes") + 1])
    from transformers.utils.chat_template_utils import render_jinja_template  # the renderer apply_chat_template uses

    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        reply: dict
        try:
            req = json.loads(line)
            rendered, _ = render_jinja_template(conversations=[req["conversation"]], chat_template=req["chat_template"],
                                                add_generation_prompt=req["add_generation_prompt"],
                                                **req["kwargs"])
            text = rendered[0]
            if len(text) > req["max_chars"]:
                reply = {"error": f"it rendered {len(text):,} characters; the limit is {req['max_chars']:,}"}
            else:
                reply = {"text": text}
        except MemoryError:
            reply = {"error": "it ran out of its memory limit"}
        except Exception as exc:  # noqa: BLE001 - a template's own error (raise_exception, a bad filter...)
            reply = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500], "template_error": True}
        try:
            out.write(json.dumps(reply) + "\n")
            out.flush()
        except MemoryError:
            return


if __name__ == "__main__":
    main()
