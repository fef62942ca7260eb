"""The optional parts a server may advertise are named once, in env.proto's header. The conformance suite keeps
its own copy (it tests servers in any language, without importing ours), so these tests keep the copies equal."""

from __future__ import annotations

import re
from pathlib import Path

from env_servers.conformance.target import KNOWN_CAPABILITIES
from env_servers.server.service import CAPABILITIES

ROOT = Path(__file__).resolve().parent.parent.parent


def proto_capabilities() -> list[str]:
    """The names listed under ``// - Capabilities`` in env.proto's header."""
    header = (ROOT / "protos/roll_lightning/protocol/v1/env.proto").read_text()
    section = header.split("// - Capabilities", 1)[1].split("\n// - ", 1)[0]
    return re.findall(r'^//\s+"([a-z-]+)"\s', section, re.MULTILINE)


def node_capabilities() -> list[str]:
    source = (ROOT / "env_servers/node/lib/service.js").read_text()
    listed = re.search(r"const CAPABILITIES = Object\.freeze\(\[([^\]]*)\]\)", source)
    assert listed, "env_servers/node/lib/service.js no longer declares CAPABILITIES"
    return re.findall(r"'([a-z-]+)'", listed.group(1))


def test_the_conformance_suite_knows_every_capability_the_protocol_names() -> None:
    named = proto_capabilities()
    assert len(named) >= 2, "env.proto's Capabilities section was not found or lists nothing"
    assert list(KNOWN_CAPABILITIES) == named


def test_the_servers_advertise_only_capabilities_the_protocol_names() -> None:
    named = set(proto_capabilities())
    assert set(CAPABILITIES) <= named
    assert node_capabilities() and set(node_capabilities()) <= named
