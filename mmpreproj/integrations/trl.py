"""TRL's `SFTTrainer` with an injected model: checkpoints hold the adapter, and resume restores it.

    from mmpreproj.integrations.trl import PreProjSFTTrainer   # instead of trl.SFTTrainer
    model = mmpreproj.inject(AutoModelForCausalLM.from_pretrained(...))
    PreProjSFTTrainer(model=model, args=SFTConfig(...), train_dataset=chat, processing_class=tok).train()

The same three overrides as `mmpreproj.integrations.transformers.PreProjTrainer` (see there why), put in
front of `trl.SFTTrainer`; TRL's own work (chat templates, tokenizing, packing, its model card) is
unchanged. Pass the injected model, not a `peft_config`, or inject, then wrap with peft yourself
(`mmpreproj.train.apply_method(model, "preproj_lora")`); `preproj_trainer(cls)` does the same for TRL's
other trainers.
"""

from __future__ import annotations

from trl import SFTTrainer

from .transformers import preproj_trainer

__all__ = ["PreProjSFTTrainer"]

PreProjSFTTrainer = preproj_trainer(SFTTrainer)
