"""Trained folders, above the tuner (as peft keeps its loaders outside `peft/tuners/`): `load` (`load_adapter`: one
`detect` tells the kinds of folder apart and hands each to its loader), `load_injection` (our adapter folder into a
model, or beside an adapter already there), `stacked` (`preproj_lora`'s `PeftModel` class: peft's LoRA and ours
saved and loaded as one folder), `pretrained_load` (`from_pretrained`: a whole-model folder or hub id) and `resume`
(`last_whole_checkpoint`: the newest whole Trainer checkpoint)."""
