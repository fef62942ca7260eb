"""Generated protocol stubs (do not edit; `python protos/generate.py`, checked by tests/test_protocol_stubs.py)."""
