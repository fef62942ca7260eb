"""WebShop-lite: hand-computed purchase rewards, the page state machine, invalid actions, determinism, BM25 search,
the original-data loader and a fuzz test of random replies."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from env_servers.api import ConfigError, parse_config
from env_servers.envs.webshop import (
    Catalogue,
    Goal,
    Product,
    WebShopConfig,
    WebShopEnv,
    default_catalogue,
    load_webshop_data,
    parse_action,
    purchase_reward,
)
from env_servers.envs.webshop.catalogue import catalogue_fingerprint
from env_servers.envs.webshop.generated import generate_catalogue
from env_servers.envs.webshop.original import parse_pricing
from env_servers.envs.webshop.reward import normalize_color, option_matches, type_reward
from env_servers.envs.webshop.search import stem, tokenize
from env_servers.registry import get_env

REPO = Path(__file__).resolve().parents[3]
# sha256 of the default generated catalogue (3000 products, seed 0). A deliberate generator change must update this
# and bump CATALOGUE_VERSION; an accidental one (or a Python whose random streams differ) fails here.
DEFAULT_FINGERPRINT = "50f96dcf65c4c2e6117099000283f6ae95ac930b438f530b119b60a02d445e21"


def product(asin: str, title: str, **kw) -> Product:
    fields = {
        "category": "shoes",
        "product_category": "Clothing › Men › Shoes › Running Shoes",
        "query": "men's running shoes",
        "bullets": (),
        "description": "",
        "attributes": (),
        "options": (),
        "price": 10.0,
        "price_tag": "$10.00",
    }
    fields.update(kw)
    return Product(asin=asin, title=title, **fields)


# A hand-written mini catalogue. Nouns come from the lexicon: the target's title has five of them
# {acme, trail, shoes, sneakers, men}.
LEXICON = {"acme", "zeta", "trail", "shoes", "sneakers", "men", "women", "sandals", "teapot"}
TARGET = product(
    "B000000001",
    "Acme Trail Running Shoes Sneakers for Men",
    bullets=("Rubber sole for grip.",),
    description="Lightweight and breathable.",
    attributes=("non slip", "lightweight"),
    options=(("color", ("black", "white")), ("size", ("9", "10"))),
    price=40.0,
    price_tag="$40.00",
)
PRICEY = product(
    "B000000002",
    "Acme Trail Running Shoes Sneakers for Men - Premium",
    bullets=("Rubber sole for grip.",),
    attributes=("non slip",),
    options=(("color", ("black",)), ("size", ("10",))),
    price=60.0,
    price_tag="$60.00",
)
TEAPOT = product(
    "B000000003",
    "Zeta Ceramic Teapot",
    category="kitchen",
    product_category="Home › Kitchen › Teapots",
    query="teapot",
    bullets=("Holds 1 liter.",),
    attributes=("dishwasher safe",),
    options=(("color", ("black", "blue")),),
    price=20.0,
    price_tag="$20.00",
)
SANDALS = product(
    "B000000004",
    "Acme Leather Sandals for Women",
    category="women's shoes",
    product_category="Clothing › Women › Sandals",
    query="women's sandals",
    bullets=("Non slip rubber sole.",),
    attributes=("open toe",),
    options=(("color", ("black", "brown")), ("size", ("7", "8"))),
    price=30.0,
    price_tag="$30.00",
)
LIGHT = product(
    "B000000005",
    "Acme Trail Running Shoes Sneakers for Men",
    bullets=("Breathable mesh upper.",),
    description="Great for trails.",
    attributes=("Non-Slip",),
    options=(("color", ("black",)), ("size", ("10",))),
    price=45.0,
    price_tag="$45.00",
)
GOAL = Goal(
    product=0,
    instruction="i need non slip trail running shoes with rubber sole with color: black, and size: 10, "
    "and price lower than 50.00 dollars",
    attributes=("non slip", "rubber sole"),
    options=(("color", "black"), ("size", "10")),
    price_upper=50.0,
)


@pytest.fixture(scope="module")
def mini() -> Catalogue:
    return Catalogue([TARGET, PRICEY, TEAPOT, SANDALS, LIGHT], [GOAL], noun_lexicon=LEXICON)


def buy(catalogue: Catalogue, bought: Product, chosen: dict[str, str]) -> float:
    return purchase_reward(GOAL, TARGET, bought, chosen, catalogue.nouns).reward


# Every case: R = r_type * (A + O + P) / (2 attributes + 2 options + 1) = r_type * (A + O + P) / 5.
def test_reward_exact_match(mini):
    # A = 2 ("non slip" fuzzy-matches an attribute; "rubber sole" is in the bullets), O = 2, P = 1, r_type = 1.
    assert buy(mini, TARGET, {"color": "black", "size": "10"}) == pytest.approx(1.0)


def test_reward_wrong_option(mini):
    # white is not black: O = 1 -> (2 + 1 + 1) / 5; no option chosen at all: O = 0 -> 3 / 5.
    assert buy(mini, TARGET, {"color": "white", "size": "10"}) == pytest.approx(0.8)
    assert buy(mini, TARGET, {}) == pytest.approx(0.6)


def test_reward_over_budget(mini):
    # Same nouns (title_score 1, r_type 1), A = 2, O = 2, but $60 > $50: P = 0 -> 4 / 5.
    breakdown = purchase_reward(GOAL, TARGET, PRICEY, {"color": "black", "size": "10"}, mini.nouns)
    assert not breakdown.price_ok
    assert breakdown.reward == pytest.approx(0.8)


def test_reward_wrong_type(mini):
    # Teapot: no goal noun in its title -> title_score 0 -> r_type 0, whatever A/O/P (here A 0, O 1, P 1).
    assert buy(mini, TEAPOT, {"color": "black"}) == pytest.approx(0.0)
    # Sandals: nouns {acme, sandals, women} share 1 of 5 -> title_score 0.2 (not > 0.2); other query; paths share
    # only "Clothing" -> r_type 0.5. A = 2 (both attributes are substrings of "non slip rubber sole."), O = 1 (black;
    # size 8 is not 10), P = 1 ($30) -> 0.5 * 4 / 5 = 0.4.
    breakdown = purchase_reward(GOAL, TARGET, SANDALS, {"color": "black", "size": "8"}, mini.nouns)
    assert (breakdown.r_type, breakdown.title_score, breakdown.attr_matches, breakdown.option_matches) == (
        0.5,
        pytest.approx(0.2),
        2,
        1,
    )
    assert breakdown.reward == pytest.approx(0.4)


def test_reward_type_rules_thresholds():
    words = lambda text: set(text.lower().split())  # noqa: E731 - every word is a noun here
    goal = product("A1", "a b c d e f g h i j k")  # 11 nouns
    # 1 of 11 shared (< 0.1) -> 0.1; none shared -> 0.0 (these two rules apply whatever the query and path).
    other = product("A2", "a x", query="other", product_category="X › Y › Z")
    assert type_reward(goal, other, words)[0] == 0.1
    assert type_reward(goal, product("A3", "x y", query="other", product_category="X › Y"), words)[0] == 0.0
    # 3 of 11 shared (0.27 > 0.2) -> 1.0 even with another query and path.
    assert type_reward(goal, product("A4", "a b c", query="q", product_category="X › Y"), words)[0] == 1.0
    # 2 of 11 (0.18): rescued by the same query -> 1.0; without it -> 0.5.
    assert type_reward(goal, product("A5", "a b"), words)[0] == 1.0
    assert type_reward(goal, product("A6", "a b", query="q", product_category="X › Y"), words)[0] == 0.5
    assert type_reward(goal, product("A7", ""), lambda t: set())[1] == 0.2  # no goal nouns: title_score 0.2


def test_reward_partial_attributes(mini):
    # "Non-Slip" matches "non slip" after processing (A += 1); "rubber sole" is nowhere (A = 2 - 1 = 1).
    # O = 2, P = 1, same nouns -> (1 + 2 + 1) / 5 = 0.8; with only the colour chosen: (1 + 1 + 1) / 5 = 0.6.
    assert buy(mini, LIGHT, {"color": "black", "size": "10"}) == pytest.approx(0.8)
    assert buy(mini, LIGHT, {"color": "black"}) == pytest.approx(0.6)


def test_option_matching_quirks_of_token_set_ratio():
    # WebShop's fuzzy match (thefuzz token_set_ratio with default processing) treats a word subset as a match.
    assert option_matches(["large"], ["x-large"]) == 1
    assert option_matches(["7"], ["7.5"]) == 1
    assert option_matches(["black"], ["white"]) == 0
    assert normalize_color("Dark Navy Blue") == "navy blue"


def test_no_purchase_truncates_with_zero_reward(mini):
    env = WebShopEnv(WebShopConfig(max_steps=3), catalogue=mini)
    env.reset(0, {"split": "test", "index": 0})
    results = [env.step(a) for a in ("search[trail shoes]", "click[b000000001]", "click[description]")]
    assert [r[1] for r in results] == [0.0, 0.0, 0.0]
    assert [(r[2], r[3]) for r in results] == [(False, False), (False, False), (False, True)]
    assert results[-1][4]["metrics"] == {"action_valid": 1.0, "purchased": 0.0, "success": 0.0, "score": 0.0}
    with pytest.raises(RuntimeError):
        env.step("click[< prev]")


def test_purchase_through_the_pages(mini):
    env = WebShopEnv(WebShopConfig(), catalogue=mini)
    obs, info = env.reset(0, {"split": "test", "index": 0})
    assert obs.startswith("Instruction: [SEP] " + GOAL.instruction + " [SEP] Search")
    assert obs.endswith("Available actions: search[<query>]")
    obs, *_ = env.step("<answer>search[Acme trail running shoes]</answer>")
    assert "B000000001" in obs and "click[b000000001]" in obs
    for action in ("click[B000000001]", "click[Black]", "<answer>click[10]</answer>"):
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["action_valid"] and reward == 0.0 and not terminated
    assert "black (selected)" in obs and "10 (selected)" in obs
    obs, reward, terminated, truncated, info = env.step("click[buy now]")
    assert terminated and not truncated and reward == pytest.approx(1.0)
    assert info["metrics"]["success"] == 1.0 and info["purchased_asin"] == "B000000001"
    assert info["chosen_options"] == {"color": "black", "size": "10"}
    assert "Your score (min 0.0, max 1.0) [SEP] 1.0000" in obs
    json.dumps(info)  # everything in info travels as JSON


def test_page_state_machine_on_generated_catalogue():
    env = WebShopEnv(WebShopConfig(split="test", max_steps=30))
    env.reset(5)
    obs, *_ = env.step("search[shoes for men]")
    assert "Page 1 (Total results: 50)" in obs
    assert env.clickables()[:2] == ["back to search", "next >"] and "< prev" not in env.clickables()
    first_page = [c for c in env.clickables() if c.startswith("b0")]
    assert len(first_page) == 10
    obs, *_ = env.step("click[next >]")
    assert "Page 2 (Total results: 50)" in obs and "< Prev [SEP] Next >" in obs
    second_page = [c for c in env.clickables() if c.startswith("b0")]
    assert len(second_page) == 10 and not set(first_page) & set(second_page)
    for _ in range(3):
        env.step("click[next >]")
    assert "Page 5 (Total results: 50)" in env._render() and "next >" not in env.clickables()
    env.step("click[< prev]")
    obs, *_ = env.step("click[< prev]")
    assert "Page 3 " in obs
    asin = next(c for c in env.clickables() if c.startswith("b0"))
    obs, *_ = env.step(f"click[{asin}]")
    item = env.catalogue.products[env.catalogue.by_asin[asin]]
    assert item.title in obs and f"Price: {item.price_tag}" in obs
    assert env.clickables()[-4:] == ["description", "features", "reviews", "buy now"]
    for sub, expected in (("description", item.description), ("features", item.bullets[0]), ("reviews", "")):
        obs, *_ = env.step(f"click[{sub}]")
        assert expected in obs and env.clickables() == ["back to search", "< prev"]
        obs, *_ = env.step("click[< prev]")
        assert "Buy Now" in obs
    obs, *_ = env.step("click[< prev]")  # item -> the results page it came from
    assert "Page 3 " in obs
    obs, *_ = env.step("click[back to search]")
    assert obs.endswith("Available actions: search[<query>]")
    env.step("search[shoes]")
    assert "Total results: 26" in env._render()  # fewer hits than 50: only documents matching a query word
    env.step(f"click[{env.clickables()[2]}]")
    obs, reward, terminated, truncated, info = env.step("click[buy now]")
    assert terminated and 0.0 <= reward <= 1.0 and info["metrics"]["purchased"] == 1.0


def test_invalid_actions_are_penalised_never_raise(mini):
    env = WebShopEnv(WebShopConfig(format_penalty=-0.25, max_steps=100), catalogue=mini)
    env.reset(0, {"split": "test", "index": 0})
    bad_on_search = [
        "",
        "hello",
        "click[buy now]",
        "search[]",
        "search[   ]",
        "<answer>search[x]",
        "search(x)",
        "<answer></answer>",
        "searchshoes]",
        "[search[x]]",
        "click[]",
        None,
        42,
    ]
    bad_on_item = ["search[shoes]", "click[b000000003]", "click[next >]", "click[purple]", "buy now"]
    for actions, setup in ((bad_on_search, []), (bad_on_item, ["search[acme]", "click[b000000001]"])):
        env.reset(0, {"split": "test", "index": 0})
        for a in setup:
            assert env.step(a)[4]["action_valid"]
        before = env._render()
        for action in actions:
            obs, reward, terminated, truncated, info = env.step(action)
            assert info["action_valid"] is False and info["metrics"]["action_valid"] == 0.0
            assert reward == -0.25 and not terminated and not truncated
            assert obs == before


def test_parse_action():
    assert parse_action("search[Red Shoes]") == ("search", "red shoes")
    assert parse_action("  <think>hm</think><answer> click[ Buy Now ] </answer>") == ("click", "buy now")
    assert parse_action("CLICK[< Prev]") == ("click", "< prev")
    assert parse_action("I will search[shoes]") is None
    assert parse_action("<answer>jump[x]</answer>") is None


def test_same_seed_same_goal_and_observation():
    a, b = WebShopEnv(WebShopConfig()), WebShopEnv(WebShopConfig())
    for seed in (0, 1, 12345, 2**62):
        assert a.reset(seed) == b.reset(seed)
    obs = {a.reset(s)[1]["goal_number"] for s in range(20)}
    assert len(obs) > 15  # seeds spread over the train goals
    assert a.reset(7, {"split": "dev", "index": 3.0})[1]["goal_number"] == 503
    with pytest.raises(IndexError):
        a.reset(7, {"split": "test", "index": 500})


def test_same_seed_in_a_subprocess():
    code = (
        "import json;from env_servers.envs.webshop import *;"
        "from env_servers.envs.webshop.catalogue import catalogue_fingerprint as f;"
        "e=WebShopEnv(WebShopConfig(split='dev'));o,i=e.reset(99);o2=e.step('search[green tea]')[0];"
        "print(json.dumps([o,i,o2,f(e.catalogue)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    env = WebShopEnv(WebShopConfig(split="dev"))
    obs, info = env.reset(99)
    assert json.loads(out.stdout) == [obs, info, env.step("search[green tea]")[0], catalogue_fingerprint(env.catalogue)]


def test_generated_catalogue_shape_and_fingerprint():
    cat = default_catalogue()
    assert len(cat.products) == 3000
    assert len({p.category for p in cat.products}) == 30
    assert {k: len(v) for k, v in cat.splits.items()} == {"test": 500, "dev": 1000, "train": len(cat.goals) - 1500}
    for p in cat.products[:300]:
        assert p.product_type in p.title.lower() and p.attributes and p.bullets and p.price > 0
        values = [v for _, vs in p.options for v in vs]
        assert len(values) == len(set(values))
    for g in cat.goals[:300]:
        target = cat.products[g.product]
        assert set(g.attributes) <= set(target.attributes) and target.price <= g.price_upper
        assert all(v in dict(target.options)[n] for n, v in g.options)
    assert generate_catalogue(50, seed=1).products == generate_catalogue(50, seed=1).products
    assert generate_catalogue(50, seed=1).products != generate_catalogue(50, seed=2).products
    assert catalogue_fingerprint(cat) == DEFAULT_FINGERPRINT


def test_bm25_finds_the_goal_product_by_its_title():
    cat = default_catalogue()
    ranks = []
    for g in cat.goals[:: len(cat.goals) // 60]:
        hits = cat.index.search(cat.products[g.product].title)
        ranks.append(hits.index(g.product) if g.product in hits else 99)
    assert all(r < 10 for r in ranks)
    assert sum(r == 0 for r in ranks) >= 0.8 * len(ranks)
    assert cat.index.search("zzzz qqqq") == () and cat.index.search("") == ()
    assert len(cat.index.search("shoes for men")) == 50
    assert tokenize("The Running Shoes, berries & glasses") == ["running", "shoes", "berry", "glasse"]
    assert (stem("dress"), stem("bus"), stem("boots"), stem("toes")) == ("dress", "bus", "boot", "toes")


def _write_fixture(root: Path, human: bool = True) -> None:
    products = [
        {
            "asin": "B00ORIG001",
            "name": "Bright Citrus Deodorant by Earth Mama",
            "category": "beauty",
            "query": "deodorant",
            "product_category": "Beauty & Personal Care › Personal Care › Deodorants & Antiperspirants",
            "pricing": "$10.99",
            "full_description": "Calendula deodorant for sensitive skin.",
            "small_description": ["Natural and Safe for Sensitive Skin", "Aluminum free"],
            "customization_options": {
                "Size": [{"value": "3 Ounce (Pack of 1)", "image": None}, {"value": "3 Ounce/Pack of 2", "image": None}]
            },
            "average_rating": 4.6,
        },
        {
            "asin": "B00ORIG002",
            "name": "Ginger Fresh Deodorant",
            "category": "beauty",
            "query": "deodorant",
            "product_category": "Beauty & Personal Care › Personal Care › Deodorants & Antiperspirants",
            "pricing": "$5.00 - $9.00",
            "full_description": "Ginger scent.",
            "small_description": ["Long lasting"],
            "customization_options": None,
        },
        {"asin": "B00ORIG003", "Title": "Cozy Wool Socks", "Price": None, "BulletPoints": ["Warm"]},
        {"asin": "B00ORIG001", "name": "duplicate asin: ignored"},
        {"name": "no asin: ignored"},
    ]
    attrs = {
        "B00ORIG001": {
            "attributes": ["sensitive skin", "aluminum free"],
            "instruction": "i want a deodorant for sensitive skin",
            "instruction_attributes": ["sensitive skin"],
        },
        "B00ORIG002": {
            "attributes": ["long lasting"],
            "instruction": "i need long lasting deodorant.",
            "instruction_attributes": ["long lasting"],
        },
    }
    (root / "items_shuffle_1000.json").write_text(json.dumps(products))
    (root / "items_ins_v2_1000.json").write_text(json.dumps(attrs))
    if human:
        goals = {
            "B00ORIG001": [
                {
                    "asin": "B00ORIG001",
                    "instruction": "i am looking for a citrus deodorant for sensitive skin, 3 ounce pack of 2.",
                    "instruction_attributes": ["sensitive skin"],
                    "instruction_options": ["3 Ounce | Pack of 2"],
                },
            ],
            "B00ORIG002": [
                {
                    "asin": "B00ORIG002",
                    "instruction": "ginger deodorant",
                    "instruction_attributes": ["long lasting"],
                    "instruction_options": [],
                }
            ],
            "B0MISSING0": [{"instruction": "a product we do not have"}],
        }
        (root / "items_human_ins.json").write_text(json.dumps(goals))


def test_original_data_loader(tmp_path):
    _write_fixture(tmp_path)
    cat = load_webshop_data(tmp_path)
    assert [p.asin for p in cat.products] == ["B00ORIG001", "B00ORIG002", "B00ORIG003"]
    deo, ginger, socks = cat.products
    assert deo.options == (("size", ("3 ounce (pack of 1)", "3 ounce | pack of 2")),)
    assert (deo.price, deo.price_tag, deo.rating) == (10.99, "$10.99", "4.6")
    assert deo.attributes == ("sensitive skin", "aluminum free") and deo.bullets[1] == "Aluminum free"
    assert 5.0 <= ginger.price <= 9.0 and ginger.price_tag == "$5.00 to $9.00"
    assert ginger.price == load_webshop_data(tmp_path).products[1].price  # the range price is fixed
    assert (socks.price, socks.bullets, socks.options) == (100.0, ("Warm",), ())
    assert parse_pricing("$1,299.00", "x") == (1299.0, "$1299.00")
    assert len(cat.goals) == 2 and cat.split_size("test") == 2 and cat.split_size("train") == 0
    by_product = {g.product: g for g in cat.goals}
    g = by_product[0]
    assert g.options == (("size", "3 ounce | pack of 2"),) and g.attributes == ("sensitive skin",)
    assert g.instruction.startswith("i am looking for a citrus deodorant for sensitive skin, 3 ounce pack of 2, and")
    assert g.price_upper in (30.0, 40.0, 50.0)  # max of two of 20/30/40/50
    assert cat.nouns("Bright Citrus Deodorant by Earth Mama") == {"bright", "citrus", "deodorant", "earth", "mama"}

    # Through the env, configured by data_dir as a CreateSession config would.
    config = parse_config(WebShopConfig, {"data_dir": str(tmp_path), "split": "test"}, env_id="webshop")
    env = WebShopEnv(config)
    index = next(i for i, goal in enumerate(env.catalogue.goals) if goal.product == 0)
    env.reset(0, {"split": "test", "index": index})
    env.step("search[citrus deodorant]")
    env.step("click[b00orig001]")
    env.step("click[3 ounce | pack of 2]")
    obs, reward, terminated, _, info = env.step("click[buy now]")
    assert terminated and reward == pytest.approx(1.0), info
    assert WebShopEnv.describe(config).splits == {"test": 2, "dev": 0, "train": 0}
    with pytest.raises(ValueError, match="no goals"):
        env.reset(0, {"split": "train"})


def test_original_data_loader_synthetic_goals_without_human_file(tmp_path):
    _write_fixture(tmp_path, human=False)
    cat = load_webshop_data(tmp_path, num_products=2)
    assert len(cat.products) == 2
    texts = sorted(g.instruction for g in cat.goals)
    # Product 1 has two size values (two goals), product 2 has no options (one goal).
    assert len(texts) == 3
    assert any(
        t.startswith("i want a deodorant for sensitive skin with size: 3 ounce (pack of 1), and price") for t in texts
    )
    with pytest.raises(FileNotFoundError):
        load_webshop_data(tmp_path / "nowhere")


def test_config_and_describe():
    spec = get_env("webshop").describe(parse_config(WebShopConfig, {}, env_id="webshop"))
    assert spec.env_id == "webshop" and spec.max_steps == 15 and spec.reward_max == 1.0
    assert spec.splits["test"] == 500 and spec.splits["dev"] == 1000 and spec.splits["train"] > 5000
    assert spec.reward_min == -0.05
    for bad in ({"split": "val"}, {"max_steps": 0}, {"format_penalty": 0.5}, {"num_products": 0}, {"nope": 1}):
        with pytest.raises(ConfigError):
            parse_config(WebShopConfig, bad, env_id="webshop")


_ACTION_WORDS = ["search", "click", "CLICK", "Search", "buy"]
_TARGETS = [
    "buy now",
    "< prev",
    "next >",
    "back to search",
    "description",
    "features",
    "reviews",
    "black",
    "10",
    "b000000001",
    "b000000003",
    "",
    "]",
    "[",
    "shoes",
]
_actions = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda w, t: f"{w}[{t}]", st.sampled_from(_ACTION_WORDS), st.sampled_from(_TARGETS) | st.text(max_size=15)
    ),
    st.builds(lambda a: f"<answer>{a}</answer>", st.sampled_from([f"click[{t}]" for t in _TARGETS] + ["search[acme]"])),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(_actions, max_size=25))
def test_random_actions_never_crash(mini, actions):
    env = WebShopEnv(WebShopConfig(max_steps=10), catalogue=mini)
    env.reset(0, {"split": "test", "index": 0})
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and "Available actions:" in obs
        assert math.isfinite(reward) and -0.05 <= reward <= 1.0
        assert isinstance(info["action_valid"], bool)
        json.dumps(info)
        if terminated or truncated:
            env.reset(1, {"split": "test", "index": 0})


async def test_original_data_served_through_env_config(tmp_path):
    # The operator points a server at the original files; clients play it unchanged (and cannot redirect it).
    from roll_lightning.env_client import EnvPool, EpisodeFailed
    from roll_lightning.env_client.local import launch_local_server

    _write_fixture(tmp_path)
    config = json.dumps({"data_dir": str(tmp_path), "split": "test"})
    server = launch_local_server(["webshop"], extra_args=["--env-config", f"webshop={config}"])
    try:
        async with EnvPool([server.address]) as pool:
            session = await pool.open("webshop")
            assert session.spec.splits["test"] == 2
            first = await session.reset(seed=0)
            assert "search[" in first.observation
            out = await session.step("<answer>search[citrus deodorant]</answer>")
            assert out.action_valid and "b00orig001" in out.observation.lower()
            with pytest.raises(EpisodeFailed, match="config.data_dir can only be set by the server operator"):
                await pool.open("webshop", {"data_dir": "/"})
    finally:
        server.stop()
