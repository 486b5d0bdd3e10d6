"""A checkpoint directory's files: which of them are the weights and optimizer state (what retention deletes;
the small JSON and tokenizer files stay, so a pruned arm's result is still read), and sizes on disk."""

from __future__ import annotations

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
