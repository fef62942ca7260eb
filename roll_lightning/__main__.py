"""``python -m roll_lightning fit --config configs/sokoban.yaml`` (see `roll_lightning.cli`)."""

from roll_lightning.cli import main

if __name__ == "__main__":
    main()
