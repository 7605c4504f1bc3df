"""Our own API over the tuner, and its folders (as peft keeps `inject_adapter_in_model` and its loaders and
writers outside `peft/tuners/`): `inject` (`mmpreproj.inject`: peft's injection loop, nothing installed on the
instance, as `inject_adapter_in_model`), `adapters` (`set_adapter`, `delete_adapter`, ...: through peft's record
of the adapters when there is one), `files` (`save_adapter` / `read_adapter`: an adapter folder), `pretrained_save`
(`mmpreproj.save_pretrained`: the base and its adapter in one folder), `load` (`load_adapter`: one `detect` tells
the kinds of folder apart and hands each to its loader), `load_injection` (our adapter folder into a model, or
beside an adapter already there), `stacked` (`preproj_lora`'s `PeftModel` class: peft's LoRA and ours saved and
loaded as one folder), `pretrained_load` (`from_pretrained`: a whole-model folder or hub id) and `resume`
(`last_whole_checkpoint`: the newest whole Trainer checkpoint)."""
