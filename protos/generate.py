"""Regenerate (or check) the committed Python stubs of the env protocol.

    python protos/generate.py           # rewrite roll_lightning/protocol/v1/env_pb2*.py(i)
    python protos/generate.py --check   # exit 1 if the committed stubs differ from the .proto

Needs grpcio-tools pinned to the same version as grpcio (the `dev`/`test` extras pin both), because the
generated code checks the runtime versions at import.

The file lives under protocol/ (its path names the Python package of the stubs, `roll_lightning.protocol.v1`), but
its proto `package` stays `roll_lightning.env.v1`: that is the wire name (`/roll_lightning.env.v1.EnvService/...`)
every env server speaks, so moving the file changes no RPC, message or service name.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = Path("roll_lightning/protocol/v1/env.proto")
OUTPUTS = ("env_pb2.py", "env_pb2.pyi", "env_pb2_grpc.py")


def generate(out_dir: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{ROOT / 'protos'}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(ROOT / "protos" / PROTO),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"protoc failed on {PROTO}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    check = parser.parse_args().check
    committed = ROOT / PROTO.parent
    if not check:
        generate(ROOT)
        print(f"wrote {', '.join(str(committed / n) for n in OUTPUTS)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        stale = [n for n in OUTPUTS if not filecmp.cmp(Path(tmp) / PROTO.parent / n, committed / n, shallow=False)]
    if stale:
        print(f"stale generated stubs: {', '.join(stale)}; run `python protos/generate.py`", file=sys.stderr)
        return 1
    print("generated stubs match the .proto")
    return 0


if __name__ == "__main__":
    sys.exit(main())
