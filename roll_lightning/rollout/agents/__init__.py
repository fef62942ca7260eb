"""The user's agent program as a rollout: the policy served as an OpenAI-compatible endpoint (`endpoint.py`), one
episode run by the program (`runner.py`), what each call recorded (`record.py`)."""
