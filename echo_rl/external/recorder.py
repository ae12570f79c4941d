"""Token-exact recording of a user's agent program, one episode per rollout id.

The server never re-tokenises a conversation it has served. Each rollout keeps
one append-only :class:`~echo_rl.lm.trajectory.TokenStream`, and the engine
is given *that stream* as the prompt:

- the first request is rendered once (the template's tokens, the last
  user/tool message's body as ``env_output``);
- the sampled tokens go in as sampled, with the engine's log-probs (the
  stop token included), then the template's end-of-turn tokens;
- a later request must repeat what was served, message for message (the
  program's earlier messages as it sent them, each reply as it was returned,
  tool-call ids aside); only the messages after that are new, and they are
  appended as the template's delta for them (``ChatRenderer.message_delta``:
  ``env_output``, or ``warning`` for a message marked ``"echo_rl_role":
  "warning"``).

A request that does not repeat what was served (an edited or dropped turn, new
tools, a fabricated assistant turn) *splits* the episode: the stream so far is
closed as one trajectory and a new one starts from this request's render. It
is counted (``external/splits``), never silently re-tokenised.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from echo_rl.lm.chat_delta import ChatRenderer
from echo_rl.lm.trajectory import TokenStream
from echo_rl.models.chat_template import apply_chat_template
from echo_rl.serve.errors import APIError
from echo_rl.types import TEMPLATE, TokenTrajectory

WARNING_KEY = "echo_rl_role"  # a message field a program sets to "warning" to mark a harness error


class ToolRenderer(ChatRenderer):
    """:class:`ChatRenderer` that renders with the request's tool schemas (a template with a tool format)."""

    def __init__(self, tokenizer: Any, tools: Sequence[dict] | None) -> None:
        super().__init__(tokenizer)
        self.tools = list(tools) if tools else None

    def render(self, messages: Sequence[dict], add_generation_prompt: bool) -> str:
        if not messages:
            return ""
        return apply_chat_template(self.tokenizer, list(messages), chat_template=self.chat_template,
                                   add_generation_prompt=add_generation_prompt, tools=self.tools)


def _signature(m: Any) -> tuple:
    """A request message as the comparison sees it: role, text, the call it answers, the calls it makes."""
    calls = tuple((c.function.name, c.function.arguments) for c in m.tool_calls or ())
    return m.role, m.text(), m.tool_call_id, calls


def _reply_signature(content: str | None, calls: list[dict] | None) -> tuple:
    """A served reply as the program will send it back (tool-call ids aside; they are the program's to keep)."""
    return "assistant", content or "", None, tuple((c["function"]["name"], c["function"]["arguments"])
                                                    for c in calls or ())


def _loose(sig: tuple) -> tuple:
    return sig[0], sig[1], None, sig[3]


@dataclass
class Segment:
    """One unbroken token stream of an episode, and what the program must repeat to continue it."""

    stream: TokenStream
    renderer: ToolRenderer
    tools_key: Any
    history: list[dict]  # rendered messages, replies as decoded sampled text (the renderer's history)
    sigs: list[tuple]  # what a next request must start with
    offset: int  # rendered messages before the request's own (the text tool format's system instruction)
    prompt_length: int
    turns: int = 0
    anchors: list[str] = field(default_factory=list)  # the observation each turn starts from (GiGPO's anchor)


@dataclass
class Episode:
    rollout_id: str
    policy_version: int
    segments: list[Segment] = field(default_factory=list)
    reward: float | None = None
    task: str = "default"
    finished: bool = False
    splits: int = 0
    conflicts: int = 0


class Turn:
    """One recorded request: :meth:`prompt` is the engine's prompt; :meth:`done` commits the reply."""

    def __init__(self, recorder: "Recorder", episode: Episode, req: Any, plan: Any, messages: list[dict]) -> None:
        self.recorder, self.episode, self.plan = recorder, episode, plan
        self.req, self.messages = req, messages
        self.segment: Segment | None = None
        self.context: tuple[list[int], list[int]] = ([], [])
        self.base_turns = sum(s.turns for s in episode.segments)
        self.fresh = self.split = False
        self.anchor = ""

    def prompt(self, _messages: Any = None) -> list[int]:
        """The stream the engine continues: the open segment plus the template's delta for the new messages,
        or a new segment's render when the request does not continue what was served."""
        ep, req, tok = self.episode, self.req, self.recorder.tokenizer
        sigs = [_signature(m) for m in req.messages]
        tools_key = (repr(self.plan.schemas), self.plan.mode)
        seg = ep.segments[-1] if ep.segments else None
        offset = len(self.messages) - len(req.messages)
        if seg is not None and seg.turns and self._continues(seg, sigs, tools_key):
            new = self.messages[offset + len(seg.sigs):]
            marks = req.messages[len(seg.sigs):]
            ids, roles = [], []
            for k, (msg, src) in enumerate(zip(new, marks)):
                delta = seg.renderer.message_delta(seg.history + new[:k], msg["role"],
                                                   [(_body_role(src), msg["content"])],
                                                   add_generation_prompt=k == len(new) - 1)
                ids += delta.token_ids
                roles += delta.roles
            self.segment, self.context = seg, (ids, roles)
            self.anchor = "".join(m["content"] for m in new)
            return seg.stream.token_ids + ids
        self.split = seg is not None and seg.turns > 0
        renderer = ToolRenderer(tok, self.plan.schemas if self.plan.mode == "template" else None)
        last = self.messages[-1]
        if last["role"] in ("user", "tool"):
            head = self.messages[:-1]
            prefix = renderer.encode(renderer.render(head, add_generation_prompt=False))
            delta = renderer.message_delta(head, last["role"], [(_body_role(req.messages[-1]), last["content"])])
            ids, roles = prefix + delta.token_ids, [TEMPLATE] * len(prefix) + delta.roles
        else:
            ids = renderer.encode(renderer.render(self.messages, add_generation_prompt=True))
            roles = [TEMPLATE] * len(ids)
        stream = TokenStream(episode_id=len(ep.segments), policy_version=ep.policy_version)
        self.segment = Segment(stream, renderer, tools_key, [dict(m) for m in self.messages], [], offset, len(ids))
        self.context = (ids, roles)
        self.fresh, self.anchor = True, last["content"]
        return list(ids)

    def _continues(self, seg: Segment, sigs: list[tuple], tools_key: Any) -> bool:
        n = len(seg.sigs)
        if tools_key != seg.tools_key or len(sigs) <= n or len(self.messages) - len(self.req.messages) != seg.offset:
            return False
        if [_loose(s) if s[0] == "assistant" else s for s in sigs[:n]] != \
                [_loose(s) if s[0] == "assistant" else s for s in seg.sigs]:
            return False
        return all(s[0] in ("user", "tool") for s in sigs[n:])  # an assistant turn the policy never wrote: split

    def done(self, action_ids: list[int], logprobs: list[float], text: str, version: int) -> None:
        """Commit the sampled reply (``text``: what was returned, read back into content and tool calls)."""
        rec, ep, seg = self.recorder, self.episode, self.segment
        with rec.lock:
            if ep.finished or sum(s.turns for s in ep.segments) != self.base_turns or seg is None:
                ep.conflicts += 1  # another request of this rollout got in first: this reply is not recorded
                rec.count("conflicts")
                return
            if self.fresh:
                ep.segments.append(seg)
                ep.splits += self.split
                rec.count("splits", int(self.split))
            sigs = [_signature(m) for m in self.req.messages]
            ids, roles = self.context
            seg.stream.extend_context(ids, roles)
            seg.history = seg.history + self.messages[seg.offset + len(seg.sigs):] if seg.turns else seg.history
            seg.stream.extend_action(action_ids, logprobs[:len(action_ids)], [version] * len(action_ids))
            end = seg.renderer.turn_end(seg.history)
            if end and action_ids[-1] == end[0]:
                end = end[1:]
            seg.stream.extend_context(end, [TEMPLATE] * len(end))
            seg.stream.rewards.append(0.0)
            decoded = rec.tokenizer.decode(action_ids, skip_special_tokens=True)
            seg.history.append({"role": "assistant", "content": decoded})
            content, calls = self.plan.read(self.plan.prefill + text)
            seg.sigs = sigs + [_reply_signature(content, calls)]
            seg.anchors.append(self.anchor)
            seg.turns += 1
            rec.count("turns")


def _body_role(message: Any) -> str:
    extra = getattr(message, "model_extra", None) or {}
    return "warning" if extra.get(WARNING_KEY) == "warning" else "env_output"


class Recorder:
    """Every rollout's episode; the server calls :meth:`open` per request, the trainer :meth:`start` /
    :meth:`finish` per episode and :meth:`report` on a reward."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.episodes: dict[str, Episode] = {}
        self.finished: set[str] = set()
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.version = 0  # the served policy's version (the trainer sets it after each sync)

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def start(self, rollout_id: str) -> None:
        with self.lock:
            self.episodes[rollout_id] = Episode(rollout_id, self.version)

    def _live(self, rollout_id: str | None, what: str) -> Episode:
        if not rollout_id:
            raise APIError(400, f"{what}: this server records training episodes, so a request must name its "
                           "rollout (base URL .../rollout/<id>/v1 or the x-echo-rl-rollout header)",
                           code="rollout_required")
        ep = self.episodes.get(rollout_id)
        if ep is None or ep.finished:
            state = "finished" if rollout_id in self.finished or ep is not None else "unknown"
            self.count(f"{state}_rollout_requests")
            raise APIError(404 if state == "unknown" else 409, f"{what}: rollout {rollout_id[:80]!r} is {state}; "
                           "only the running episodes' rollout ids are accepted", code=f"{state}_rollout")
        return ep

    def open(self, rollout_id: str | None, req: Any, plan: Any, messages: list[dict]) -> Turn:
        """A request of rollout ``rollout_id`` (one reply: n must be 1)."""
        with self.lock:
            ep = self._live(rollout_id, "chat request")
        if req.n != 1:
            raise APIError(400, "n must be 1 in a recorded episode (one reply per turn)", param="n")
        if plan.prefill:
            raise APIError(400, "tool_choice naming a function is not supported in a recorded episode with the "
                           "text tool format; use 'auto'", param="tool_choice")
        return Turn(self, ep, req, plan, messages)

    def report(self, rollout_id: str | None, reward: Any, task: Any) -> None:
        """The program's reward for its episode (once), and the task it played (episodes are grouped by task)."""
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward != reward \
                or abs(reward) == float("inf"):
            raise APIError(400, f"reward={reward!r} is invalid: must be a finite number", param="reward")
        if task is not None and (not isinstance(task, str) or not 0 < len(task) <= 200):
            raise APIError(400, "task must be a string of 1 to 200 characters", param="task")
        with self.lock:
            ep = self._live(rollout_id, "reward")
            if ep.reward is not None:
                self.count("repeated_rewards")
                raise APIError(409, f"reward: rollout {rollout_id[:80]!r} already reported {ep.reward}; one "
                               "reward per episode", code="reward_already_reported")
            ep.reward, ep.task = float(reward), task or "default"

    def finish(self, rollout_id: str) -> tuple[Episode, list[TokenTrajectory]]:
        """Close the episode (later requests for it get a 409) and return its trajectories (the reward on each
        segment's last turn); none when it reported no reward or took no turn."""
        with self.lock:
            ep = self.episodes.pop(rollout_id)
            ep.finished = True
            self.finished.add(rollout_id)
        if ep.reward is None or not any(s.turns for s in ep.segments):
            return ep, []
        out = []
        for k, seg in enumerate(s for s in ep.segments if s.turns):
            seg.stream.rewards[-1] = ep.reward
            out.append(seg.stream.to_trajectory(seg.prompt_length, rollout_id=ep.rollout_id, task=ep.task,
                                                segment=k, splits=ep.splits, history=list(seg.history),
                                                anchor_states=list(seg.anchors)))
        return ep, out

