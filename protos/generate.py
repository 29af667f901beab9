"""Regenerate the committed gRPC/protobuf code from protos/ps.proto.

Run from the repository root:  python -m protos.generate
(``--check`` compares instead of writing; the test suite uses it to catch stale code.)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = "protos/ps.proto"
OUTPUTS = ("protos/ps_pb2.py", "protos/ps_pb2_grpc.py", "protos/ps_pb2.pyi")


def generate(out_dir: Path) -> None:
    """Run protoc (from grpcio-tools) on ps.proto, writing into out_dir/protos/."""
    from grpc_tools import protoc

    (out_dir / "protos").mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(ROOT / PROTO),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")


def stale_files() -> list[str]:
    """Generated files that differ from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        return [
            name
            for name in OUTPUTS
            if not (ROOT / name).exists()
            or (Path(tmp) / name).read_bytes() != (ROOT / name).read_bytes()
        ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed code is stale")
    args = parser.parse_args()
    if args.check:
        stale = stale_files()
        if stale:
            print("stale generated code: " + ", ".join(stale) + " (run: python -m protos.generate)", file=sys.stderr)
            return 1
        print("generated code is up to date")
        return 0
    generate(ROOT)
    print("wrote " + ", ".join(OUTPUTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
