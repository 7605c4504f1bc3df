"""Pack the CIFAR-10 class split of the mini-ViT experiment into reproducible zips under assets/cifar10/.

Classes 0-4 (airplane, automobile, bird, cat, deer) pretrain `assets/mini-vit`; classes 5-9 (dog, frog, horse,
ship, truck) are never seen there and are the frozen probe's task. Every member is a byte-for-byte copy of the
file of the same path in the shared `cifar10-images/` folder (checked against its SHA256SUMS while packing):

    pretrain-train.zip   train/<class 0-4>/0000-0499.jpg   2,500 images (pretraining)
    pretrain-test.zip    test/<class 0-4>/0000-0299.jpg    1,500 images (the checkpoint's held-out accuracy)
    probe-train.zip      train/<class 5-9>/0000-0499.jpg   2,500 images (the probe trains on these)
    probe-test.zip       test/<class 5-9>/0000-0999.jpg    5,000 images (the probe is scored on these)

    .venv/bin/python recipes/vision/pack_cifar_split.py --src /work/shared/data/cifar10-images
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# zip name -> (split, class indices, images per class)
SPLITS: dict[str, tuple[str, range, int]] = {
    "pretrain-train.zip": ("train", range(0, 5), 500),
    "pretrain-test.zip": ("test", range(0, 5), 300),
    "probe-train.zip": ("train", range(5, 10), 500),
    "probe-test.zip": ("test", range(5, 10), 1000),
}


def read_sums(src: Path) -> dict[str, str]:
    """{relative path: sha256} from the shared folder's SHA256SUMS."""
    sums = {}
    for line in (src / "SHA256SUMS").read_text().splitlines():
        digest, _, name = line.partition("  ")
        sums[name.strip()] = digest
    return sums


def pack(src: Path, out: Path, name: str, sums: dict[str, str]) -> str:
    """Write one zip (ZIP_STORED, members sorted, dated 2020-01-01); return its sha256."""
    split, classes, per_class = SPLITS[name]
    members = [f"{split}/{CLASSES[c]}/{i:04d}.jpg" for c in classes for i in range(per_class)]
    with zipfile.ZipFile(out / name, "w", zipfile.ZIP_STORED) as z:
        for member in members:
            data = (src / member).read_bytes()
            if hashlib.sha256(data).hexdigest() != sums[member]:
                raise ValueError(f"{member}: sha256 differs from {src / 'SHA256SUMS'}")
            z.writestr(zipfile.ZipInfo(member, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return hashlib.sha256((out / name).read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", default="/work/shared/data/cifar10-images", help="the shared cifar10-images folder")
    parser.add_argument("--out", default=str(REPO / "assets" / "cifar10"), help="where the zips go")
    args = parser.parse_args(argv)
    src, out = Path(args.src), Path(args.out)
    sums = read_sums(src)
    for name in SPLITS:
        digest = pack(src, out, name, sums)
        print(f"{digest}  {name}  {(out / name).stat().st_size:,} B")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `recipes.command`
    from recipes.command import run_main  # a refusal in one line naming its flags

    run_main(main)
