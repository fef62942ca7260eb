"""The trainer's picture encoding (the model's image processor) with and without `ImageEncoder`'s cache, side by side.

One rollout step's pictures of the pixel recipe (``configs/frozenlake_pixels.yaml``): 8 maps x 8 members, each
member 1-3 moves (a group's members start from the same picture), encoded by a fresh `ImageEncoder` five times
per variant; the median is reported. One torch thread.

Run:  .venv/bin/python bench/image_encode.py
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from transformers import AutoTokenizer  # noqa: E402

from env_servers.envs.frozenlake import FrozenLakeConfig, FrozenLakeEnv  # noqa: E402
from roll_lightning.env_client.session import ObservationImage  # noqa: E402
from roll_lightning.models.resolve import resolve_model  # noqa: E402
from roll_lightning.rollout.prompts.vision import ImageEncoder  # noqa: E402


def step_pictures() -> list[bytes]:
    pictures = []
    for board in range(8):
        for member in range(8):
            env = FrozenLakeEnv(FrozenLakeConfig(size=4, is_slippery=False, render="image"))
            obs, _ = env.reset(2 * board)
            pictures.append(obs.images[0].data)
            for move in ["Down", "Right", "Down"][: 1 + member % 3]:
                obs, _, terminated, truncated, _ = env.step(f"<answer>{move}</answer>")
                pictures.append(obs.images[0].data)
                if terminated or truncated:
                    break
    return pictures


def main() -> None:
    folder = resolve_model("tiny-vl-words")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    pictures = [ObservationImage(data, "image/png") for data in step_pictures()]
    medians = {}
    for name, cache_size in [("no cache", 0), ("cache", 256)]:
        times = []
        for _ in range(5):
            encoder = ImageEncoder.load(folder, tokenizer)
            assert encoder is not None
            encoder.cache_size = cache_size
            started = time.perf_counter()
            for picture in pictures:
                encoder.encode(picture)
            times.append(time.perf_counter() - started)
        medians[name] = statistics.median(times)
        distinct = len({p.data for p in pictures})
        print(f"{name:9s} {medians[name] * 1000:6.1f} ms for {len(pictures)} pictures ({distinct} distinct)")
    print(f"cache speed-up: {medians['no cache'] / medians['cache']:.1f}x; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
