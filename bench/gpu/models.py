"""Models for the GPU scripts, made by the packed `turnpike make-model` in bf16 (so the CUDA
device, the CPU device and transformers all read the same weights) and kept between runs."""

import pathlib
import subprocess
import sys


def make(dist: pathlib.Path, work: pathlib.Path, preset: str) -> pathlib.Path:
    folder = work / f"{preset}-bf16"
    if not (folder / "config.json").exists():
        subprocess.run([str(dist / "turnpike"), "make-model", "--preset", preset, "--out", str(folder),
                        "--dtype", "bf16"], check=True, stdout=sys.stderr)
    return folder
