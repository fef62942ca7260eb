"""``python -m roll_lightning fit --config configs/sokoban.yaml`` (see `roll_lightning.cli`)."""

from roll_lightning.exits import exit_stopped


def entry() -> None:
    """The CLI; a Ctrl-C during the slow imports exits 130 with one line, not a traceback."""
    try:
        from roll_lightning.cli import main
    except KeyboardInterrupt as stop:
        exit_stopped(stop, [])
    main()


if __name__ == "__main__":
    entry()
