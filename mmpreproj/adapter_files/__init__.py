"""What an adapter folder's files must hold, checked from the files alone (no model, no tuner): `digest`
(the weights' digest in `adapter_config.json`, so a save cut short is refused on load) and `file_check` (the
tensors of a weights file against its config's sizes; `refuse_links` before a writer writes in place), and
`model_card` (the README.md an adapter folder may carry, written from its description). The tuner
(`mmpreproj.tuner`: `config`, `files`, `pretrained`, `model`; `mmpreproj.folders.resume`) writes and reads the
folders and calls these; peft keeps such file handling out of a tuner's folder too (`peft/utils/save_and_load.py`).
"""
