"""The one ``device`` setting of the inference stages (``auto | cpu | cuda | cuda:<i>``).

Resolved once at the flow boundary (:func:`resolve_device`) and passed down as a string; models
do no device lookups (STYLE 6): a stage moves the model it loaded to the device it was given.
"""
from __future__ import annotations


def resolve_device(setting: str = "auto") -> str:
    """``"auto"`` → ``"cuda"`` when torch sees a GPU, else ``"cpu"``; ``cpu`` / ``cuda[:i]`` checked.

    Raises
    ------
    ValueError
        An unknown setting, or a CUDA device that is not there.
    """
    import torch  # noqa: PLC0415  (heavy: torch, only when a device setting is resolved)

    setting = setting.strip().lower()
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting == "cpu":
        return "cpu"
    if setting == "cuda" or setting.startswith("cuda:"):
        index = int(setting.split(":", 1)[1]) if ":" in setting else 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise ValueError(f"device {setting!r}: torch sees {torch.cuda.device_count()} GPU(s)")
        return setting
    raise ValueError(f"device must be auto, cpu, cuda or cuda:<i>, got {setting!r}")
