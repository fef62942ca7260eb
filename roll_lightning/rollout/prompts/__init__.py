"""How a conversation becomes prompt tokens (`chat.py`), pictures become vision tokens (`vision.py`), and a reply
becomes tool calls (`tool_calls.py`)."""
