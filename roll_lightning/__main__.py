"""``python -m roll_lightning fit --config configs/sokoban.yaml`` (see `roll_lightning.cli`)."""

from roll_lightning.exits import exit_stopped


def entry() -> None:
    """The CLI, with a Ctrl-C while it still imports torch and Lightning (seconds) ending in the same one line and
    status 130 as one later on, instead of a traceback from inside an import."""
    try:
        from roll_lightning.cli import main
    except KeyboardInterrupt as stop:
        exit_stopped(stop, [])
    main()


if __name__ == "__main__":
    entry()
