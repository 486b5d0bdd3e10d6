"""A checkpoint directory's files: which of them are the weights and optimizer state (what retention deletes;
the small JSON and tokenizer files stay, so a pruned arm's result is still read), and sizes on disk."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

# Model weights (safetensors, a sharded or a LoRA adapter's too; torch .bin) and optimizer state (optimizer.pt).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def weight_files(ckpt: str | Path) -> list[Path]:
    """The weight and optimizer-state files directly in a checkpoint directory (none when it is absent)."""
    ckpt = Path(ckpt)
    if not ckpt.is_dir():
        return []
    return sorted(p for p in ckpt.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)


def has_weights(ckpt: str | Path) -> bool:
    """Whether a checkpoint can be loaded and forked from: its model weights are on disk."""
    return any(p.suffix != ".pt" for p in weight_files(ckpt))


def damaged(ckpt: str | Path) -> list[tuple[Path, str]]:
    """(file, what is wrong) for each weight file of a checkpoint that does not read whole. Checked by the
    format's own bookkeeping, without loading: a safetensors file's header must parse and its tensors end
    where the file does; a torch.save file (a zip) must have its central directory."""
    out = []
    for p in weight_files(ckpt):
        if why := _safetensors_damage(p) if p.suffix == ".safetensors" else _zip_damage(p):
            out.append((p, why))
    return out


def _safetensors_damage(p: Path) -> str:
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 <= n <= size - 8:
            return f"truncated safetensors file ({size} bytes, no whole header)"
        try:
            tensors = json.loads(f.read(n))
            end = max((t["data_offsets"][1] for k, t in tensors.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, IndexError):
            return "damaged safetensors header"
    return "" if 8 + n + end == size else f"truncated safetensors file ({size} bytes of {8 + n + end})"


def _zip_damage(p: Path) -> str:
    with open(p, "rb") as f:
        if f.read(2) != b"PK":
            return ""  # not torch.save's zip format (a legacy pickle): nothing cheap to check
    return "" if zipfile.is_zipfile(p) else f"truncated torch file ({p.stat().st_size} bytes, no zip directory)"


def tree_bytes(path: str | Path) -> int:
    """Bytes of every file under `path` (0 when it is absent)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def human(n: float) -> str:
    """Bytes for a reader: `512 B`, `3.4 MB`, `1.2 GB`."""
    unit = "B"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            break
        n /= 1000
    return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
