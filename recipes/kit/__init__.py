"""What the vision, video and mixed recipes share: recipe code, not library code.

    from recipes.kit import fit_classifier, load_image_zip, read_video, parse_config, print_table
    from recipes.kit.backbones import load_backbone        # pretrained timm / open_clip towers for frozen probes

- `data`: the shipped CIFAR-10 zips and video frames (PyAV);
- `fit`: a small supervised loop (AdamW, warmup + cosine, accuracy);
- `recipe`: a CLI from a config dataclass, a markdown table, JSON and plots;
- `backbones`: pretrained or tiny random towers. Unlike the library, it may change process-wide state: with
  no network it sets `HF_HUB_OFFLINE` so huggingface_hub reads its cache instead of retrying for a minute.

A recipe script puts the repository root on `sys.path` and imports `recipes.kit`.
"""

from .data import load_image_zip, read_video
from .fit import FitResult, accuracy, correct_items, fit_classifier, log_interval
from .recipe import environment, parse_config, plot_bars, plot_curves, print_table, write_json

__all__ = [
    "FitResult",
    "accuracy",
    "correct_items",
    "environment",
    "fit_classifier",
    "log_interval",
    "load_image_zip",
    "parse_config",
    "plot_bars",
    "plot_curves",
    "print_table",
    "read_video",
    "write_json",
]
