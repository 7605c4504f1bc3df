"""A small VLM from real parts: DINOv2-S (frozen) -> a trained projector -> SmolLM2-135M (frozen), image
tokens on a 2D (row, column) grid and text on 1D positions through `mmpreproj.rope.use_multimodal_rope`.

- `features`: the frozen tower's pooled patch tokens, computed once per split and cached;
- `tasks`: the questions (class name; where a class sits in a 2 x 2 mosaic), chat turns, batches, positions;
- `model`: projector + LM, answer loss, greedy generation with the KV cache (and by full recompute);
- `arms`: projector only, + pre-projection + skip, + LoRA; training with per-step times, scoring, save/reload;
- `study`: the groups, the LR search on held-out items, seeds, restartable steps (the text study's planner);
- `report`: the markdown table with paired intervals, read back from the evidence files.

Run by `recipes/mixed/dinov2_smollm2.py`.
"""
