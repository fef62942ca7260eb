"""Generated protocol stubs (do not edit; `python protos/generate.py`, checked by tests/protocol/test_stubs.py)."""
