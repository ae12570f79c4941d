"""WebShop (Yao et al. 2022) as a text environment: search, click, choose options, buy.

The text-mode interaction of upstream ``WebAgentTextEnv``: ``search[query]`` on
the search page, ``click[value]`` on a button, a result's ASIN or an option
value (case-insensitive); pages are the search page, result pages (10 of the
top 50 BM25 hits each), the item page (options, Description / Features /
Reviews, Buy Now) and its sub-pages. ``click[Buy Now]`` ends the episode with
the real WebShop reward (:mod:`webshop_reward`). Observation modes: ``text``
(upstream's ``[SEP]``-joined page text) and ``react`` (one element per line,
clickables in brackets, as ReAct's prompts show them).

Search: BM25 (rank_bm25's ``BM25Okapi`` with Lucene's idf, k1=0.9, b=0.4: pyserini's defaults) over
lower(Title + Description + first bullet + options), as upstream indexes;
Lucene's stemming/stop words are not reproduced, so rankings differ slightly.

Data: see :mod:`webshop_data`; with no real catalogue the environment runs on
the synthetic one and says so in ``label`` and ``info["benchmark"]``.

Expert: :class:`RuleBuyer`, a rule-based buyer that reads only the instruction
and the pages: it searches the instruction, opens the result whose title covers
the instruction best within the price limit, picks the options named in the
instruction and buys.
"""

from __future__ import annotations

import copy
import random
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from echo_rl.config import ConfigBase, spec
from echo_rl.environments import registry
from echo_rl.environments import webshop_data as data
from echo_rl.environments.base import (Segment, StepOutcome, TextEnvironment, data_dir_spec, env_output,
                                       make_config, max_steps_spec, resolve_data_dir, warning)
from echo_rl.environments.reply_format import TaskFormat
from echo_rl.environments.webshop_reward import get_reward
from echo_rl.utils.optional import require

SEARCH_RETURN_N = 50
PER_PAGE = 10
SYNTHETIC_LABEL = "WebShop (synthetic catalogue)"
REAL_LABEL = "WebShop"
_ACTION = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.S | re.I)
_TOKEN = re.compile(r"[a-z0-9]+")


@dataclass
class WebShopConfig(ConfigBase):
    """Which WebShop goals and how the site is shown.

    ``website_type`` keeps goals whose product is in one WebShop category
    (beauty, electronics, fashion, food, furniture; ``all`` keeps every goal);
    ``budget_limit`` keeps goals whose price ceiling ("price lower than X
    dollars") is at most this many dollars. The catalogue itself is always whole.
    """

    website_type: str = spec("all", help="product category of the goals", choices=("all",) + data.CATEGORIES)
    budget_limit: float | None = spec(None, help="keep goals whose price ceiling is <= this (None: all)")
    split: str = spec("test", help="goal split after upstream's seed-233 shuffle: test [0:500], eval "
                      "[500:1500], train [1500:], all", choices=tuple(data.SPLITS))
    goals: str = spec("synthetic", help="synthetic (items_ins_v2 instructions) or human (needs "
                      "items_human_ins.json and the real catalogue)", choices=("synthetic", "human"))
    catalogue: str = spec("auto", help="auto: the real items_shuffle_1000.json when present, else synthetic; "
                          "real; synthetic", choices=("auto", "real", "synthetic"))
    observation_mode: str = spec("text", help="text ([SEP]-joined, upstream) or react (lines, [clickables])",
                                 choices=("text", "react"))
    distractors_per_goal: int = spec(2, help="synthetic catalogue: hard negatives per goal product", min=0)
    catalogue_seed: int = spec(0, help="seed of the synthetic catalogue and of the goal prices", min=0)
    max_steps: int = max_steps_spec(15)
    data_dir: str | None = data_dir_spec()

    def validate(self) -> None:
        if self.budget_limit is not None and self.budget_limit <= 0:
            self._fail("budget_limit", self.budget_limit, "must be None or > 0")
        if self.goals == "human" and self.catalogue == "synthetic":
            self._fail("goals", self.goals, "human goals need the real catalogue (catalogue=auto or real)")


class _Shop:
    """Products, goals and the search index; built once per (data, config) and shared."""

    def __init__(self, cfg: WebShopConfig):
        root = resolve_data_dir(cfg.data_dir, "webshop", "ECHO_RL_WEBSHOP_DIR", data.HOW_TO_GET)
        attributes = data.load_attributes(root)
        real_path = root / "items_shuffle_1000.json"
        use_real = cfg.catalogue == "real" or (cfg.catalogue == "auto" and real_path.is_file())
        if cfg.catalogue == "real" and not real_path.is_file():
            raise FileNotFoundError(f"WebShop catalogue {real_path} not found; {data.HOW_TO_GET}")
        rng = random.Random(cfg.catalogue_seed)
        if use_real:
            human = None
            if cfg.goals == "human":
                hpath = root / "items_human_ins.json"
                if not hpath.is_file():
                    raise FileNotFoundError(f"WebShop file {hpath} not found (goals=human); {data.HOW_TO_GET}")
                human = data.read_human_instructions(hpath)
            self.products = data.load_real_catalogue(real_path, attributes, human)
            self.label = REAL_LABEL
        else:
            if cfg.goals == "human":
                raise FileNotFoundError(f"goals=human needs {real_path} and items_human_ins.json; {data.HOW_TO_GET}")
            self.products = data.synthetic_catalogue(attributes, cfg.catalogue_seed, cfg.distractors_per_goal)
            self.label = SYNTHETIC_LABEL
        self.by_asin = {p["asin"]: p for p in self.products}
        self.prices = data.product_prices(self.products, rng)
        make = data.human_goals if cfg.goals == "human" else data.synthetic_goals
        self.all_goals = data.shuffled(make(self.products, self.prices, rng))
        docs = [_TOKEN.findall(_document(p)) for p in self.products]
        self.index = _lucene_bm25(docs)

    def search(self, query: str) -> list[str]:
        tokens = _TOKEN.findall(query.lower())
        if not tokens:
            return []
        scores = self.index.get_scores(tokens)
        order = np.argsort(-scores, kind="stable")[:SEARCH_RETURN_N]
        return [self.products[i]["asin"] for i in order if scores[i] > 0]


def _lucene_bm25(docs: list[list[str]]) -> Any:
    """rank_bm25's BM25Okapi with Lucene's always-positive idf, log(1 + (N - n + 0.5) / (n + 0.5)).

    BM25Okapi's own idf is <= 0 for terms in half the documents or more, which
    silently drops matches on small catalogues; Lucene (what upstream searches
    with, via pyserini) never does.
    """
    bm25 = require("rank_bm25", "webshop", "rank_bm25")

    class LuceneIdfBM25(bm25.BM25Okapi):
        def _calc_idf(self, nd: dict) -> None:
            self.idf = {w: float(np.log(1.0 + (self.corpus_size - n + 0.5) / (n + 0.5))) for w, n in nd.items()}

    return LuceneIdfBM25(docs, k1=0.9, b=0.4)


def _document(p: dict) -> str:
    opts = [v for vs in p["options"].values() for v in vs]
    opt_text = ("opt: " + ", ".join(opts[:-1]) + (" and " if len(opts) > 1 else "") + opts[-1]) if opts else ""
    bullet = p["BulletPoints"][0] if p["BulletPoints"] else ""
    return f"{p['Title']} {p['Description']} {bullet} {opt_text}".lower()


_SHOPS: dict[tuple, _Shop] = {}


def _shop(cfg: WebShopConfig) -> _Shop:
    key = (cfg.data_dir, cfg.catalogue, cfg.goals, cfg.distractors_per_goal, cfg.catalogue_seed)
    if key not in _SHOPS:
        _SHOPS[key] = _Shop(cfg)
    return _SHOPS[key]


class WebShopEnvironment(TextEnvironment):
    """One shopping goal per episode; the reward is WebShop's, paid on ``click[Buy Now]``."""

    supports_snapshot = True
    has_expert = True

    def __init__(self, config: WebShopConfig | None = None, render_mode: str | None = None, **overrides: Any):
        config = make_config(WebShopConfig, config, overrides)
        super().__init__(config, render_mode)
        self.shop = _shop(config)
        lo, hi = data.SPLITS[config.split]
        goals = self.shop.all_goals[lo:hi]
        if config.website_type != "all":
            goals = [g for g in goals if g["category"] == config.website_type]
        if config.budget_limit is not None:
            goals = [g for g in goals if g["price_upper"] <= config.budget_limit]
        self.goals = goals
        self.label = self.shop.label
        self._page: dict = {}
        self._buyer: RuleBuyer | None = None

    @property
    def goal(self) -> dict:
        return self.goals[self._task_index]

    def _num_tasks(self) -> int:
        return len(self.goals)

    def _task_id(self) -> str:
        return f"{self.config.split}_{self._task_index}"

    def _info(self, segments: list[Segment]) -> dict:
        info = super()._info(segments)
        info["benchmark"] = self.label
        return info

    # -- pages ---------------------------------------------------------------------------
    def _reset_task(self, index: int, options: dict) -> list[Segment]:
        self._page = {"kind": "search", "query": "", "results": [], "page": 1, "asin": None, "options": {},
                      "sub": None}
        self._buyer = None
        return env_output(self._render())

    def _admissible_actions(self) -> list[str]:
        pg = self._page
        if pg["kind"] == "search":
            return ["search[<query>]"]
        return [f"click[{c}]" for c in self._clickables()]

    def _clickables(self) -> list[str]:
        pg = self._page
        if pg["kind"] == "results":
            out = ["Back to Search"]
            if pg["page"] > 1:
                out.append("< Prev")
            if pg["page"] * PER_PAGE < len(pg["results"]):
                out.append("Next >")
            return out + [a for a in self._page_asins()]
        if pg["kind"] == "item":
            p = self.shop.by_asin[pg["asin"]]
            opts = [v for vs in p["options"].values() for v in vs]
            return ["Back to Search", "< Prev"] + opts + ["Description", "Features", "Reviews", "Buy Now"]
        if pg["kind"] == "sub":
            return ["Back to Search", "< Prev"]
        return []

    def _page_asins(self) -> list[str]:
        pg = self._page
        start = (pg["page"] - 1) * PER_PAGE
        return pg["results"][start:start + PER_PAGE]

    def _render(self) -> str:
        pg, instr = self._page, self.goal["instruction_text"]
        items: list[tuple[str, bool]] = []
        if pg["kind"] == "search":
            items = [("WebShop", False), ("Instruction:", False), (instr, False), ("Search", True)]
        else:
            if self.config.observation_mode == "text":
                items = [("Instruction:", False), (instr, False)]
            items.append(("Back to Search", True))
            if pg["kind"] == "results":
                items.append((f"Page {pg['page']} (Total results: {len(pg['results'])})", False))
                if pg["page"] > 1:
                    items.append(("< Prev", True))
                if pg["page"] * PER_PAGE < len(pg["results"]):
                    items.append(("Next >", True))
                for asin in self._page_asins():
                    p = self.shop.by_asin[asin]
                    items += [(asin, True), (p["Title"], False), (p["Price"], False)]
            else:
                p = self.shop.by_asin[pg["asin"]]
                items.append(("< Prev", True))
                if pg["kind"] == "item":
                    for name, values in p["options"].items():
                        items.append((name, False))
                        items += [(v, True) for v in values]
                    items += [(p["Title"], False), (f"Price: {p['Price']}", False),
                              (f"Rating: {p.get('Rating', 'N.A.')}", False)]
                    items += [(b, True) for b in ("Description", "Features", "Reviews", "Buy Now")]
                else:
                    sub = pg["sub"]
                    if sub == "description":
                        text = p["Description"] or "N.A."
                    elif sub == "features":
                        text = " ".join(p["BulletPoints"]) or "N.A."
                    else:
                        text = " ".join(str(r) for r in p.get("Reviews", [])) or "N.A."
                    items.append((text, False))
        if self.config.observation_mode == "text":
            return " [SEP] ".join(t for t, _ in items)
        lines = [f"[{t}]" if c else t for t, c in items]
        if pg["kind"] == "item" and pg["options"]:
            lines.append("Selected: " + ", ".join(f"{k}: {v}" for k, v in pg["options"].items()))
        return "\n".join(lines)

    # -- actions ---------------------------------------------------------------------------
    def _step(self, action: str) -> StepOutcome:
        m = _ACTION.match(action)
        if not m:
            return StepOutcome(warning("Invalid action: use search[query] or click[button] (e.g. click[Buy Now])."))
        verb, arg = m.group(1).lower(), m.group(2).strip()
        pg = self._page
        if verb == "search":
            if pg["kind"] != "search":
                return StepOutcome(warning("You can only search on the search page; click[Back to Search] first."))
            if not arg:
                return StepOutcome(warning("Empty search query."))
            pg.update(kind="results", query=arg, results=self.shop.search(arg), page=1)
            return StepOutcome(env_output(self._render()))
        clickables = {c.lower(): c for c in self._clickables()}
        target = clickables.get(arg.lower())
        if target is None:
            return StepOutcome(warning(f"Invalid click: {arg[:80]!r} is not on this page."))
        if target == "Back to Search":
            pg.update(kind="search", query="", results=[], page=1, asin=None, options={}, sub=None)
        elif target == "Next >":
            pg["page"] += 1
        elif target == "< Prev":
            if pg["kind"] == "results":
                pg["page"] -= 1
            elif pg["kind"] == "item":
                pg.update(kind="results", asin=None, options={})
            else:
                pg.update(kind="item", sub=None)
        elif pg["kind"] == "results":
            pg.update(kind="item", asin=target, options={})
        elif target in ("Description", "Features", "Reviews"):
            pg.update(kind="sub", sub=target.lower())
        elif target == "Buy Now":
            return self._buy()
        else:  # an option value
            p = self.shop.by_asin[pg["asin"]]
            for name, values in p["options"].items():
                if target in values:
                    pg["options"][name] = target
                    break
            if self.config.observation_mode == "react":  # what ReAct's WebShop traces show
                return StepOutcome(env_output(f"You have clicked {target}."))
        return StepOutcome(env_output(self._render()))

    def _buy(self) -> StepOutcome:
        pg = self._page
        product = self.shop.by_asin[pg["asin"]]
        price = self.shop.prices[pg["asin"]]
        reward, parts = get_reward(product, self.goal, price, dict(pg["options"]))
        text = f"Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] {reward:.2f}"
        if self.config.observation_mode == "react":
            text = f"Thank you for shopping with us!\nYour score (min 0.0, max 1.0): {reward:.2f}"
        won = reward >= 1.0 - 1e-9
        return StepOutcome(env_output(text), float(reward), True, won,
                           {"reward_parts": parts, "bought_asin": pg["asin"], "goal_asin": self.goal["asin"]})

    # -- expert and snapshot --------------------------------------------------------------
    def expert_action(self) -> str:
        """The rule-based buyer's next action (reads the instruction and the current page only)."""
        if self._buyer is None:
            self._buyer = RuleBuyer()
        return self._buyer.act(self)

    def snapshot(self) -> Any:
        return self._base_state(), copy.deepcopy(self._page), copy.deepcopy(self._buyer)

    def restore(self, snap: Any) -> None:
        base, page, buyer = snap
        self._restore_base(dict(base))
        self._page = copy.deepcopy(page)
        self._buyer = copy.deepcopy(buyer)


_STOPWORDS = set("""i im i'm need want looking for a an the me find with and of in to that is are it its be
please some my this which also would like get buy am can you do not less than lower price dollars""".split())


class RuleBuyer:
    """Search the instruction; open the best-covering result under the price limit; pick named options; buy."""

    def __init__(self) -> None:
        self.tried: set[str] = set()
        self.searches = 0

    @staticmethod
    def _keywords(instruction: str) -> list[str]:
        body = re.sub(r",? and price lower than [\d.]+ dollars", "", instruction.lower())
        body = re.sub(r" with [a-z ]+: .*$", "", body)  # the option list
        return [w for w in _TOKEN.findall(body) if w not in _STOPWORDS]

    @staticmethod
    def _limit(instruction: str) -> float:
        m = re.search(r"price lower than ([\d.]+) dollars", instruction)
        return float(m.group(1)) if m else float("inf")

    def act(self, env: WebShopEnvironment) -> str:
        pg, instr = env._page, env.goal["instruction_text"]
        if pg["kind"] == "search":
            words = self._keywords(instr)
            self.searches += 1
            if self.searches > 1:  # the full query found nothing new: broaden it
                words = words[-max(1, len(words) // self.searches):]
            return f"search[{' '.join(words)}]"
        if pg["kind"] == "sub":
            return "click[< Prev]"
        if pg["kind"] == "results":
            words = set(self._keywords(instr))
            limit = self._limit(instr)
            best, best_score = None, -1.0
            for asin in pg["results"]:
                if asin in self.tried:
                    continue
                p = env.shop.by_asin[asin]
                title = set(_TOKEN.findall(p["Title"].lower()))
                score = (len(words & title) / max(len(words), 1) - (0.5 if p["pricing"][0] > limit else 0.0)
                         - 1e-6 * p["pricing"][0])  # ties: the cheaper item
                if score > best_score:
                    best, best_score = asin, score
            if best is None:
                return "click[Back to Search]"
            self.tried.add(best)
            page_of = pg["results"].index(best) // PER_PAGE + 1
            if page_of > pg["page"]:
                return "click[Next >]"
            if page_of < pg["page"]:
                return "click[< Prev]"
            return f"click[{best}]"
        # item page: choose the option values the instruction names, then buy
        p = env.shop.by_asin[pg["asin"]]
        wanted = instr.lower()
        for name, values in p["options"].items():
            if name in pg["options"]:
                continue
            named = [v for v in values if f"{name}: {v}" in wanted] or [v for v in values if v in wanted]
            if named:
                return f"click[{max(named, key=len)}]"
        return "click[Buy Now]"


def _factory(**kw: Any) -> WebShopEnvironment:
    return WebShopEnvironment(WebShopConfig(**kw))


_WEBSHOP = TaskFormat(
    instruction=("Reply with exactly one action and nothing else: search[your query] on a search page, or "
                 "click[a button or option exactly as shown between [SEP] marks]."),
    example=("WebShop [SEP] Instruction: [SEP] Find me a blue cotton t-shirt in size large, and price lower "
             "than 30.00 dollars [SEP] Search"),
    answer="search[blue cotton t-shirt large]",
    thought="I should search for the product with its main attributes.",
    more=(("Instruction: [SEP] Find me a blue cotton t-shirt in size large, and price lower than 30.00 dollars "
           "[SEP] Back to Search [SEP] Page 1 (Total results: 2) [SEP] Next > [SEP] B0EXAMPLE1 [SEP] Cotton "
           "Crew T-Shirt Blue [SEP] $18.50 [SEP] B0EXAMPLE2 [SEP] Wool Sweater Grey [SEP] $45.00",
           "click[B0EXAMPLE1]"),
          ("Instruction: [SEP] Find me a blue cotton t-shirt in size large, and price lower than 30.00 dollars "
           "[SEP] Back to Search [SEP] < Prev [SEP] size [SEP] medium [SEP] large [SEP] Cotton Crew T-Shirt Blue "
           "[SEP] Price: $18.50 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now",
           "click[large]"),
          ("Instruction: [SEP] Find me a blue cotton t-shirt in size large, and price lower than 30.00 dollars "
           "[SEP] Back to Search [SEP] < Prev [SEP] size [SEP] medium [SEP] large [SEP] Cotton Crew T-Shirt Blue "
           "[SEP] Price: $18.50 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now",
           "click[Buy Now]")),
    max_tokens=48)


registry.register_text_env(
    "webshop", _factory, reply_format=_WEBSHOP, description="WebShop: search, choose options, buy",
    data="items_ins_v2_1000.json ($ECHO_RL_WEBSHOP_DIR; echo-rl env-data --download webshop says how); without it a synthetic catalogue")

__all__ = ["WebShopConfig", "WebShopEnvironment", "RuleBuyer", "SYNTHETIC_LABEL", "REAL_LABEL"]
