"""Boards as pictures: the PNG encoder, and FrozenLake's and Sokoban's `render` modes showing the text board's state."""

from __future__ import annotations

import io
import random
import zlib

import numpy as np
import pytest
from PIL import Image as PILImage

from env_servers.api import IMAGE_MARKER, ConfigError, Observation
from env_servers.envs import frozenlake
from env_servers.envs.board_image import IMAGE_METRICS
from env_servers.envs.png import encode_png
from env_servers.envs.sokoban import picture as sokoban
from env_servers.registry import get_env

FL_MOVES = ["<answer>Left</answer>", "<answer>Down</answer>", "<answer>Right</answer>", "<answer>Up</answer>"]
SOKO_MOVES = ["<answer>Up</answer>", "<answer>Down</answer>", "<answer>Left</answer>", "<answer>Right</answer>"]
# Text symbol -> (colour at the cell's centre, colour of the ground ring around a disc/box, or None if no shape).
FL_SYMBOLS = {
    "O": (frozenlake._GROUNDS["H"], None),
    "G": (frozenlake._GROUNDS["G"], None),
    "P": (frozenlake.PLAYER_COLOUR, "ice"),
    "X": (frozenlake.PLAYER_COLOUR, frozenlake._GROUNDS["H"]),
    "√": (frozenlake.PLAYER_COLOUR, frozenlake._GROUNDS["G"]),
}
SOKO_SYMBOLS = {
    "#": (sokoban._WALL_C, None),
    "_": (sokoban._FLOOR_C, None),
    "O": (sokoban._TARGET_C, None),
    "X": (sokoban.BOX_COLOUR, sokoban._FLOOR_C),
    "√": (sokoban.BOX_ON_TARGET_COLOUR, sokoban._TARGET_C),
    "P": (sokoban.PLAYER_COLOUR, sokoban._FLOOR_C),
    "S": (sokoban.PLAYER_COLOUR, sokoban._TARGET_C),
}


def make(env_id: str, **values):
    entry = get_env(env_id)
    return entry.env_cls(entry.make_config(values))


def decode(data: bytes) -> np.ndarray:
    image = PILImage.open(io.BytesIO(data))
    assert image.format == "PNG" and image.mode == "RGB"
    return np.asarray(image)


def split_both(obs: Observation) -> tuple[str, str]:
    """A `both` observation's text board and what follows its marker (one marker, one image)."""
    assert isinstance(obs, Observation) and len(obs.images) == 1 and obs.text.count(IMAGE_MARKER) == 1
    assert obs.images[0].media_type == "image/png"
    board, after = obs.text.split(f"\n{IMAGE_MARKER}", 1)
    return board, after


def assert_picture_matches(board: str, data: bytes, cell_pixels: int, expected) -> None:
    """Each cell's centre pixel (and, at 28 px, the ground ring under a disc or box) has its symbol's colour."""
    rows = board.split("\n")
    pixels = decode(data)
    assert pixels.shape == (len(rows) * cell_pixels, len(rows[0]) * cell_pixels, 3)
    mid = cell_pixels // 2
    for r, row in enumerate(rows):
        for c, symbol in enumerate(row):
            centre, ground = expected(r, c, symbol)
            y, x = r * cell_pixels, c * cell_pixels
            assert tuple(pixels[y + mid, x + mid]) == centre, (r, c, symbol)
            if ground is not None and cell_pixels == 28:
                assert tuple(pixels[y + 2, x + 2]) == ground, (r, c, symbol)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (28, 28), (168, 224), (7, 300)])
def test_png_round_trips_through_pil_and_is_byte_identical(shape):
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    array = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
    data = encode_png(array)
    assert np.array_equal(decode(data), array)
    assert encode_png(array.copy()) == data
    assert encode_png(np.asfortranarray(array)) == data  # the memory layout does not matter


def test_png_holds_only_the_required_chunks():
    data = encode_png(np.full((4, 6, 3), 200, dtype=np.uint8))
    chunks, at = [], 8
    while at < len(data):
        length = int.from_bytes(data[at : at + 4], "big")
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        assert int.from_bytes(data[at + 8 + length : at + 12 + length], "big") == zlib.crc32(kind + body)
        chunks.append(kind)
        at += 12 + length
    assert chunks == [b"IHDR", b"IDAT", b"IEND"]


@pytest.mark.parametrize(
    "bad", [np.zeros((2, 2, 3), np.float32), np.zeros((2, 2), np.uint8), np.zeros((0, 2, 3), np.uint8)]
)
def test_png_refuses_what_it_cannot_encode(bad):
    with pytest.raises(ValueError, match="uint8|pixel"):
        encode_png(bad)


@pytest.mark.parametrize(
    ("size", "cell_pixels", "observation"), [(4, 28, "board"), (6, 28, "board+words"), (5, 7, "board")]
)
def test_frozenlake_picture_shows_the_text_boards_state(size, cell_pixels, observation):
    for seed in range(6):
        env = make("frozenlake", size=size, render="both", cell_pixels=cell_pixels, observation=observation)
        text_env = make("frozenlake", size=size, observation=observation)
        obs, info = env.reset(seed)
        text_obs, _ = text_env.reset(seed)
        desc = env._desc

        def expected(r, c, symbol, desc=desc):
            if symbol == "_":
                return frozenlake._GROUNDS["S" if desc[r][c] == "S" else "F"], None
            centre, ground = FL_SYMBOLS[symbol]
            return centre, frozenlake._GROUNDS["S" if desc[r][c] == "S" else "F"] if ground == "ice" else ground

        moves = random.Random(seed)
        for turn in range(8):
            board, after = split_both(obs)
            assert f"{board}{after}" == text_obs  # `both` = the text observation with the marker after the board
            assert_picture_matches(board, obs.images[0].data, cell_pixels, expected)
            metrics = info if turn == 0 else info["metrics"]
            assert metrics["image_bytes"] == len(obs.images[0].data) and metrics["image_encode_s"] > 0
            move = moves.choice(FL_MOVES)
            obs, _, terminated, truncated, info = env.step(move)
            text_obs, *_ = text_env.step(move)
            if terminated or truncated:
                board, _ = split_both(obs)
                assert_picture_matches(board, obs.images[0].data, cell_pixels, expected)  # X or √ drawn too
                break


@pytest.mark.parametrize(
    ("config", "cell_pixels"), [({}, 28), ({"dim_room": [8, 7], "num_boxes": 2}, 28), ({"outer_wall": False}, 5)]
)
def test_sokoban_picture_shows_the_text_boards_state(config, cell_pixels):
    for seed in range(5):
        env = make("sokoban", render="both", cell_pixels=cell_pixels, **config)
        text_env = make("sokoban", **config)
        obs, info = env.reset(seed)
        text_obs, _ = text_env.reset(seed)
        moves = random.Random(seed)
        for turn in range(12):
            board, after = split_both(obs)
            assert board == text_obs and after == ""
            assert_picture_matches(board, obs.images[0].data, cell_pixels, lambda r, c, s: SOKO_SYMBOLS[s])
            metrics = info if turn == 0 else info["metrics"]
            assert metrics["image_bytes"] == len(obs.images[0].data) and metrics["image_encode_s"] > 0
            move = moves.choice(SOKO_MOVES)
            obs, _, terminated, truncated, info = env.step(move)
            text_obs, *_ = text_env.step(move)
            if terminated or truncated:
                break


def test_a_box_on_a_target_and_the_player_on_a_target_are_drawn():
    level = "######\n#S√_O#\n#_XX_#\n######"
    env = make("sokoban", render="image")
    obs, _ = env.reset(0, {"level": level})
    assert obs.text == IMAGE_MARKER
    assert_picture_matches(level, obs.images[0].data, 28, lambda r, c, s: SOKO_SYMBOLS[s])


@pytest.mark.parametrize("env_id", ["frozenlake", "sokoban"])
def test_the_same_state_gives_the_same_png_bytes(env_id):
    moves = FL_MOVES if env_id == "frozenlake" else SOKO_MOVES
    for seed in (0, 3, 11):
        a, b = make(env_id, render="image"), make(env_id, render="image")
        pictures = [(a.reset(seed)[0], b.reset(seed)[0])]
        for move in moves[:3]:
            one, _, done, cut, _ = a.step(move)
            pictures.append((one, b.step(move)[0]))
            if done or cut:
                break
        for one, two in pictures:
            assert one == two  # text and PNG bytes
        assert a._observe()[0] == pictures[-1][0]


def test_image_mode_keeps_the_words_around_the_board():
    fl = make("frozenlake", render="image", observation="board+words")
    obs, _ = fl.reset(4)
    words = frozenlake.describe_in_words(fl._desc, *fl._pos)
    assert obs.text == f"{IMAGE_MARKER}\n{words}" and len(obs.images) == 1
    assert make("frozenlake", render="image").reset(4)[0].text == IMAGE_MARKER
    assert make("sokoban", render="image").reset(4)[0].text == IMAGE_MARKER
    pixels = decode(make("frozenlake", render="image", size=6).reset(4)[0].images[0].data)
    assert pixels.shape == (168, 168, 3)  # 6 cells x 28 px: one Qwen2-VL token (28 = 14 x 2 merge) per cell


@pytest.mark.parametrize("env_id", ["frozenlake", "sokoban"])
def test_text_mode_sends_no_picture_and_the_spec_lists_image_metrics_only_when_pictured(env_id):
    entry = get_env(env_id)
    env = make(env_id)
    obs, info = env.reset(2)
    assert isinstance(obs, str) and not set(IMAGE_METRICS) & set(info)
    obs, *_, info = env.step("<answer>Up</answer>")
    assert isinstance(obs, str) and not set(IMAGE_METRICS) & set(info["metrics"])
    assert not set(IMAGE_METRICS) & set(entry.describe(entry.make_config({})).metrics)
    for render in ("image", "both"):
        spec = entry.describe(entry.make_config({"render": render}))
        assert set(IMAGE_METRICS) <= set(spec.metrics)
        assert "Picture:" in spec.instruction and ("Symbols:" in spec.instruction) == (render == "both")
        step_metrics = make(env_id, render=render)
        step_metrics.reset(2)
        assert set(step_metrics.step("<answer>Up</answer>")[-1]["metrics"]) == set(spec.metrics)


@pytest.mark.parametrize("env_id", ["frozenlake", "sokoban"])
def test_bad_render_settings_are_refused_by_name(env_id):
    entry = get_env(env_id)
    with pytest.raises(ConfigError, match=r"config\.render='png' must be one of 'text', 'image', 'both'"):
        entry.make_config({"render": "png"})
    with pytest.raises(ConfigError, match=r"config\.cell_pixels=3 must be >= 4"):
        entry.make_config({"render": "image", "cell_pixels": 3})
    with pytest.raises(ConfigError, match="config.render"):
        entry.config_cls(render="Image")  # built directly too
