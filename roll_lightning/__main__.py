"""``python -m roll_lightning fit --config configs/sokoban.yaml`` (see `roll_lightning.cli`)."""

from roll_lightning.exits import entry  # imports the CLI itself, so a Ctrl-C during the imports is one line too

if __name__ == "__main__":
    entry()
