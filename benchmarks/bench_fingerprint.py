"""What a weight fingerprint costs per GiB of weights: the sum of |x| per tensor that specwake compared before (blind to
a moved or negated value) against the reading it compares now (specwake.worker.digest: the position-weighted digest of
the bits, with the sums that say how a tensor differs), on the same tensors, interleaved in one run so that their ratio
holds whatever else the machine is doing. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/bench_fingerprint.py [--device cpu|cuda|cuda:N] [--gib 0.25] [--repeats 5]
                                                     [--dtypes float32,bfloat16] [--threads N]

`--device cuda` runs both on a CUDA device (synchronized before each clock reading); the default is cuda when torch
sees one, else cpu. Each dtype gets its own set of layer-shaped tensors of `--gib` GiB in all; a figure is the median
over the repeats. Σ|x| is timed twice: as it read (4 Mi elements at a time) and in the digest's pieces, which tells
what the digest costs from what the piece size saves.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch  # noqa: TID251 (torch is what this measures, as the workers run it)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specwake.worker.digest import READ, READ_DEFAULT, Sums  # noqa: E402

GIB = 1024**3
LEGACY_CHUNK = 1 << 22  # what the sum of |x| read at a time


@torch.no_grad()
def abs_sum(tensor: torch.Tensor, chunk_size: int = LEGACY_CHUNK) -> tuple[float, int, bool]:
    """The fingerprint of one tensor as specwake read it before: Σ|x| over the finite values in float64, the count of
    the others, whether any is not zero; the same steps, chunk by chunk."""
    total, nonfinite, nonzero = 0.0, 0, False
    for chunk in tensor.detach().reshape(-1).split(chunk_size):
        values = chunk.to(torch.float64)
        finite = torch.isfinite(values)
        nonfinite += int((~finite).sum().item())
        values = torch.where(finite, values, torch.zeros_like(values))
        nonzero = nonzero or bool(values.any().item()) or not bool(finite.all().item())
        total += float(values.abs().sum().item())
    return total, nonfinite, nonzero


def digest(tensor: torch.Tensor) -> Sums:
    return Sums.of([tensor])


def layers(gib: float, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """Tensors shaped like a decoder's weights (a square, a wide and a tall one, repeated) until `gib` GiB."""
    size = torch.empty((), dtype=dtype).element_size()
    hidden = 2048 if gib >= 0.5 else 1024
    shapes = [(hidden, hidden), (4 * hidden, hidden), (hidden, 4 * hidden)]
    found, held, generator = [], 0, torch.Generator(device=device).manual_seed(0)
    while held < gib * GIB:
        shape = shapes[len(found) % len(shapes)]
        found.append(torch.randn(shape, generator=generator, device=device).to(dtype))
        held += found[-1].numel() * size
    return found


def seconds(read: Callable[[torch.Tensor], object], tensors: list[torch.Tensor], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for tensor in tensors:
        read(tensor)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--gib", type=float, default=0.25, help="GiB of tensors per dtype")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's own choice)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    read = READ.get(device.type, READ_DEFAULT)
    print(
        f"torch {torch.__version__} on {device} ({where}); elements read at a time: digest {read}, Σ|x| {LEGACY_CHUNK}"
    )
    print("s/GiB: Σ|x| as before; Σ|x| read in the digest's pieces; the digest with its sums. Ratios: digest / each.")
    print(f"{'dtype':<14} {'GiB':>5} {'Σ|x|':>8} {'Σ|x| pieces':>12} {'digest':>8} {'/ Σ|x|':>8} {'/ pieces':>9}")
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name.strip())
        tensors = layers(args.gib, dtype, device)
        held = sum(t.numel() * t.element_size() for t in tensors) / GIB
        digest(tensors[0]), abs_sum(tensors[0])  # warm up: position weights, kernels, the allocator
        found: dict[str, list[float]] = {"old": [], "pieces": [], "new": []}
        for _ in range(args.repeats):
            found["old"].append(seconds(abs_sum, tensors, device) / held)
            found["pieces"].append(seconds(lambda t: abs_sum(t, read), tensors, device) / held)
            found["new"].append(seconds(digest, tensors, device) / held)
        old, pieces, new = (statistics.median(found[key]) for key in ("old", "pieces", "new"))
        ratio = statistics.median(n / o for n, o in zip(found["new"], found["old"], strict=True))
        same = statistics.median(n / o for n, o in zip(found["new"], found["pieces"], strict=True))
        print(f"{name:<14} {held:5.2f} {old:8.3f} {pieces:12.3f} {new:8.3f} {ratio:7.2f}× {same:8.2f}×")
        del tensors
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
